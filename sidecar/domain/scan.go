package domain

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// document records where, in the original bytes, the parts the mutation
// touches are. Offsets are byte offsets into the input.
type document struct {
	hasDevices    bool
	devStart      int // '<' of <devices>
	devEnd        int // just past </devices> (or past <devices/>)
	devSelfClosed bool
	insertAt      int    // where a new hostdev goes: past the last child of <devices>
	closeWS       string // whitespace right before </devices>
	childWS       string // whitespace right before the first child of <devices>
	domainClose   int    // '<' of </domain>
	hostdevs      []existingHostdev
	// interfaces are the <interface> children of <devices> with an alias.
	interfaces []existingHostdev
	// pciUsers are the children of <devices> with a guest PCI address.
	pciUsers []pciUser
	// offPorts are the pcie-root-ports whose <target> has hotplug="off".
	offPorts []offPort
}

// existingHostdev is a <hostdev> or <interface> child of <devices>.
type existingHostdev struct {
	kind       string // elemHostdev or elemInterface
	start, end int
	wsStart    int // start of the whitespace run that precedes the element
	alias      string
	guestBus   int    // bus of its guest PCI <address>, -1 without one
	targetDev  string // an interface's <target dev>
}

// pciUser is a device on a guest PCI bus; alias is set for a hostdev.
type pciUser struct {
	bus     int
	hostdev bool
	alias   string
}

// offPort is a pcie-root-port with hotplug="off"; [attrStart, attrEnd) is
// the attribute with the whitespace before it.
type offPort struct {
	index              int
	attrStart, attrEnd int
}

type wsRun struct {
	start, end int
	text       string // set only when it differs from the input bytes
	ok         bool
}

// str is the whitespace run's text.
func (w wsRun) str(data []byte) string {
	if w.text != "" {
		return w.text
	}
	return string(data[w.start:w.end])
}

func isSpace(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}

// scan tokenizes the whole document (so malformed XML is rejected here, not
// by libvirt) and records the positions splice needs. It reads raw tokens
// (no namespace translation, a third of the cost of Token) and checks the
// nesting itself. Element names are compared with their prefix: libvirt's
// own elements carry none, and KubeVirt's metadata and qemu:commandline
// keep theirs.
func scan(data []byte) (*document, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("domain XML is empty")
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	doc := &document{domainClose: -1}
	var (
		depth     int
		roots     int
		inDevices bool
		children  int
		cur       *existingHostdev
		user      pciUser // the current child of <devices>
		port      *offPort
		portIndex int // index of the current pcie-root-port, -1 in another child
		prev      wsRun
		open      []xml.Name // enclosing elements, for the nesting check
	)
	for {
		off := int(dec.InputOffset())
		tok, err := dec.RawToken()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("domain XML is not well-formed: %w", err)
		}
		end := int(dec.InputOffset())
		ws := prev
		prev = wsRun{}
		switch t := tok.(type) {
		case xml.StartElement:
			open = append(open, t.Name)
			depth++
			switch depth {
			case 1:
				roots++
				if roots > 1 {
					return nil, errors.New("domain XML has more than one root element")
				}
				if t.Name.Local != "domain" || t.Name.Space != "" {
					return nil, fmt.Errorf("domain XML root element is <%s>, want <domain>", t.Name.Local)
				}
			case 2:
				if t.Name.Local == "devices" && t.Name.Space == "" {
					if doc.hasDevices {
						return nil, errors.New("domain XML has more than one <devices> element")
					}
					doc.hasDevices, inDevices = true, true
					doc.devStart, doc.insertAt = off, end
				}
			case 3:
				if !inDevices {
					break
				}
				if children == 0 && ws.ok {
					doc.childWS = ws.str(data)
				}
				children++
				user, port, portIndex = pciUser{bus: -1}, nil, -1
				if (t.Name.Local == elemHostdev || t.Name.Local == elemInterface) && t.Name.Space == "" {
					cur = &existingHostdev{kind: t.Name.Local, start: off, wsStart: off, guestBus: -1}
					if ws.ok {
						cur.wsStart = ws.start
					}
					user.hostdev = t.Name.Local == elemHostdev
				}
				if t.Name.Local == "controller" && t.Name.Space == "" && attr(t, "type") == "pci" && attr(t, "model") == "pcie-root-port" {
					portIndex = parseNumber(attr(t, "index"), 10)
				}
			case 4:
				if !inDevices || t.Name.Space != "" {
					break
				}
				switch t.Name.Local {
				case "alias":
					if cur != nil {
						cur.alias = attr(t, "name")
						user.alias = cur.alias
					}
				case "address":
					if attr(t, "type") == "pci" {
						user.bus = parseNumber(attr(t, "bus"), 0)
					}
				case "target":
					if cur != nil && cur.kind == elemInterface {
						cur.targetDev = attr(t, "dev")
					}
					if portIndex >= 0 && attr(t, "hotplug") == "off" {
						if s, e, ok := attrSpan(data[off:end], "hotplug"); ok {
							port = &offPort{index: portIndex, attrStart: off + s, attrEnd: off + e}
						}
					}
				}
			}
		case xml.EndElement:
			if depth == 0 {
				return nil, fmt.Errorf("domain XML is not well-formed: unexpected end element </%s>", qname(t.Name))
			}
			if want := open[depth-1]; want != t.Name {
				return nil, fmt.Errorf("domain XML is not well-formed: element <%s> closed by </%s>", qname(want), qname(t.Name))
			}
			open = open[:depth-1]
			switch depth {
			case 1:
				doc.domainClose = off
			case 2:
				if inDevices {
					inDevices = false
					doc.devEnd = end
					doc.devSelfClosed = off == end
					if ws.ok {
						doc.closeWS = ws.str(data)
					}
				}
			case 3:
				if inDevices {
					doc.insertAt = end
					if cur != nil {
						cur.end, cur.guestBus = end, user.bus
						switch {
						case cur.kind == elemHostdev:
							doc.hostdevs = append(doc.hostdevs, *cur)
						case cur.alias != "":
							doc.interfaces = append(doc.interfaces, *cur)
						}
						cur = nil
					}
					if user.bus >= 0 {
						doc.pciUsers = append(doc.pciUsers, user)
					}
					if port != nil {
						doc.offPorts = append(doc.offPorts, *port)
					}
				}
			}
			depth--
		case xml.CharData:
			if isSpace(t) {
				prev = wsRun{start: off, end: end, ok: true}
				if end-off != len(t) {
					// Written with character references: keep what they mean.
					prev.text = string(t)
				}
			} else if depth == 0 {
				return nil, errors.New("domain XML has text outside the root element")
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("domain XML is not well-formed: <%s> is not closed", qname(open[depth-1]))
	}
	if roots == 0 || doc.domainClose < 0 {
		return nil, errors.New("domain XML has no <domain> element")
	}
	return doc, nil
}

// attr is the value of an unprefixed attribute of a raw start element.
func attr(t xml.StartElement, name string) string {
	for _, a := range t.Attr {
		if a.Name.Local == name && a.Name.Space == "" {
			return a.Value
		}
	}
	return ""
}

// parseNumber parses a PCI bus or controller index ("0x05", "5"), -1 when
// it is none.
func parseNumber(s string, base int) int {
	n, err := strconv.ParseUint(s, base, 16)
	if err != nil {
		return -1
	}
	return int(n)
}

// attrSpan finds the unprefixed attribute name in tag, the raw bytes of a
// well-formed start element, and returns the span from the whitespace
// before it to past its closing quote.
func attrSpan(tag []byte, name string) (start, end int, ok bool) {
	isWS := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	i := 1
	for i < len(tag) && !isWS(tag[i]) && tag[i] != '/' && tag[i] != '>' {
		i++
	}
	for i < len(tag) {
		ws := i
		for i < len(tag) && isWS(tag[i]) {
			i++
		}
		if i >= len(tag) || tag[i] == '/' || tag[i] == '>' {
			return 0, 0, false
		}
		n := i
		for i < len(tag) && tag[i] != '=' && !isWS(tag[i]) {
			i++
		}
		key := string(tag[n:i])
		for i < len(tag) && (isWS(tag[i]) || tag[i] == '=') {
			i++
		}
		if i >= len(tag) {
			return 0, 0, false
		}
		q := tag[i]
		closing := bytes.IndexByte(tag[i+1:], q)
		if closing < 0 {
			return 0, 0, false
		}
		i += closing + 2
		if key == name {
			return ws, i, true
		}
	}
	return 0, 0, false
}

// qname is a raw name as written, prefix:local.
func qname(n xml.Name) string {
	if n.Space == "" {
		return n.Local
	}
	return n.Space + ":" + n.Local
}

// lineIndent returns the spaces and tabs between the last newline before pos
// and pos, and whether pos starts its line. Reading raw bytes rather than
// tokens keeps a replacement identical to the insertion it replaces.
func lineIndent(data []byte, pos int) (string, bool) {
	i := pos
	for i > 0 && (data[i-1] == ' ' || data[i-1] == '\t') {
		i--
	}
	if i > 0 && data[i-1] == '\n' {
		return string(data[i:pos]), true
	}
	return "", false
}

type edit struct {
	start, end int
	text       []byte
}

// afterNewline returns the indentation part of a whitespace run: what
// follows its last newline, and whether it had one.
func afterNewline(ws string) (string, bool) {
	i := strings.LastIndexByte(ws, '\n')
	if i < 0 {
		return "", false
	}
	return ws[i+1:], true
}

// hostdevSizeHint is about the size of one indented hostdev with a guest
// address and boot order, so the buffer is allocated once.
const hostdevSizeHint = 512

// marshaller marshals hostdevs and standby interfaces (libvirtxml's
// MarshalXML) through one xml.Encoder, so a call pays for one encoder and
// buffer however many elements it writes.
type marshaller struct {
	buf    bytes.Buffer
	enc    *xml.Encoder
	pretty bool
}

func newMarshaller(unit string, pretty bool) *marshaller {
	m := &marshaller{pretty: pretty}
	m.enc = xml.NewEncoder(&m.buf)
	if pretty {
		m.enc.Indent("", unit)
	}
	return m
}

// marshal returns h as XML. When pretty, every line starts with prefix and
// nested elements are indented by the unit, as xml.MarshalIndent(h, prefix,
// unit) writes it.
func (m *marshaller) marshal(h hostdev, prefix string) ([]byte, error) {
	start := m.buf.Len()
	if err := m.enc.Encode(h.el); err != nil {
		return nil, fmt.Errorf("marshal %s %s: %w", h.kindName(), h.alias, err)
	}
	b := m.buf.Bytes()[start:]
	if !m.pretty {
		return b, nil
	}
	// The encoder starts every top-level element after the first on a new
	// line. Nothing inside our elements holds a raw newline (attribute values
	// are escaped), so every newline is one the indenter wrote.
	b = bytes.TrimPrefix(b, []byte{'\n'})
	if prefix == "" {
		return b, nil
	}
	out := make([]byte, 0, len(b)+len(prefix)*(1+bytes.Count(b, []byte{'\n'})))
	out = append(out, prefix...)
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return append(out, b...), nil
		}
		out = append(append(out, b[:i+1]...), prefix...)
		b = b[i+1:]
	}
}

// splice writes wanted into data: an element whose alias is already
// present on an element of its kind (<hostdev>, <interface>) replaces the
// first such element in place (later duplicates are removed); the others
// are appended after the last child of <devices>, in wanted's order. The extra
// edits (keepHotpluggable's) are applied with them.
func (d *document) splice(data []byte, wanted []hostdev, cache *HostdevCache, extra []edit) ([]byte, error) {
	closeIndent, pretty := afterNewline(d.closeWS)
	childIndent, ok := afterNewline(d.childWS)
	if !ok {
		childIndent = closeIndent + "\t"
	}
	unit := "\t"
	if strings.HasPrefix(childIndent, closeIndent) && len(childIndent) > len(closeIndent) {
		unit = childIndent[len(closeIndent):]
	}

	type kindAlias struct{ kind, alias string }
	byAlias := make(map[kindAlias]int, len(wanted))
	for i, h := range wanted {
		byAlias[kindAlias{h.kindName(), h.alias}] = i
	}
	placed := make([]bool, len(wanted))
	var ms [2]*marshaller // compact, indented; made when first needed
	marshal := func(h hostdev, prefix string, indented bool) ([]byte, error) {
		i := 0
		if indented {
			i = 1
		}
		k := cacheKey{spec: h.key, prefix: prefix, unit: unit, pretty: indented}
		if b, ok := cache.get(k); ok {
			return b, nil
		}
		if ms[i] == nil {
			ms[i] = newMarshaller(unit, indented)
			ms[i].buf.Grow(hostdevSizeHint * len(wanted))
		}
		b, err := ms[i].marshal(h, prefix)
		if err == nil {
			cache.put(k, b)
		}
		return b, err
	}
	edits := extra
	for _, e := range slices.Concat(d.hostdevs, d.interfaces) {
		i, ours := byAlias[kindAlias{e.kind, e.alias}]
		if !ours {
			continue
		}
		if placed[i] {
			edits = append(edits, edit{start: e.wsStart, end: e.end})
			continue
		}
		placed[i] = true
		indent, nl := lineIndent(data, e.start)
		b, err := marshal(wanted[i], indent, nl)
		if err != nil {
			return nil, err
		}
		edits = append(edits, edit{start: e.start, end: e.end, text: b[len(indent):]})
	}

	var add bytes.Buffer
	unplaced := 0
	for _, p := range placed {
		if !p {
			unplaced++
		}
	}
	add.Grow((hostdevSizeHint + 1) * unplaced)
	for i, h := range wanted {
		if placed[i] {
			continue
		}
		b, err := marshal(h, childIndent, pretty)
		if err != nil {
			return nil, err
		}
		if pretty {
			add.WriteByte('\n')
		}
		add.Write(b)
	}
	if add.Len() > 0 {
		switch {
		case !d.hasDevices:
			text := append([]byte("<devices>"), add.Bytes()...)
			edits = append(edits, edit{start: d.domainClose, end: d.domainClose, text: append(text, "</devices>"...)})
		case d.devSelfClosed:
			text := append([]byte("<devices>"), add.Bytes()...)
			edits = append(edits, edit{start: d.devStart, end: d.devEnd, text: append(text, "</devices>"...)})
		default:
			edits = append(edits, edit{start: d.insertAt, end: d.insertAt, text: add.Bytes()})
		}
	}

	sort.SliceStable(edits, func(a, b int) bool { return edits[a].start < edits[b].start })
	size := len(data)
	for _, e := range edits {
		size += len(e.text) - (e.end - e.start)
	}
	out := make([]byte, 0, size)
	pos := 0
	for _, e := range edits {
		out = append(out, data[pos:e.start]...)
		out = append(out, e.text...)
		pos = e.end
	}
	return append(out, data[pos:]...), nil
}
