// Package xmltree is a small generic XML tree for comparing documents by
// content (elements, attributes, text) rather than bytes, and for removing
// elements, so a test can say "the output is the input plus these hostdevs"
// without depending on any one library's idea of the domain schema.
package xmltree

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Node is an element. Namespaces are kept as the full URI in Name.Space.
type Node struct {
	Name     xml.Name
	Attrs    []xml.Attr
	Text     string // concatenated non-whitespace character data, trimmed
	Children []*Node
}

// Parse reads one XML document.
func Parse(data []byte) (*Node, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	var stack []*Node
	var root *Node
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("parse XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			n := &Node{Name: t.Name}
			for _, a := range t.Attr {
				// xmlns declarations are syntax; the resolved Name.Space carries them.
				if a.Name.Space == "xmlns" || (a.Name.Space == "" && a.Name.Local == "xmlns") {
					continue
				}
				n.Attrs = append(n.Attrs, a)
			}
			sort.Slice(n.Attrs, func(i, j int) bool { return attrKey(n.Attrs[i]) < attrKey(n.Attrs[j]) })
			if len(stack) > 0 {
				p := stack[len(stack)-1]
				p.Children = append(p.Children, n)
			} else if root == nil {
				root = n
			}
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				if s := strings.TrimSpace(string(t)); s != "" {
					stack[len(stack)-1].Text += s
				}
			}
		}
	}
	if root == nil {
		return nil, errors.New("parse XML: no root element")
	}
	return root, nil
}

func attrKey(a xml.Attr) string { return a.Name.Space + " " + a.Name.Local }

// Attr returns the value of the attribute with local name local.
func (n *Node) Attr(local string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == local {
			return a.Value
		}
	}
	return ""
}

// Child returns the first child element with local name local.
func (n *Node) Child(local string) *Node {
	for _, c := range n.Children {
		if c.Name.Local == local {
			return c
		}
	}
	return nil
}

// Find returns every descendant (including n) for which match is true.
func (n *Node) Find(match func(*Node) bool) []*Node {
	var out []*Node
	if match(n) {
		out = append(out, n)
	}
	for _, c := range n.Children {
		out = append(out, c.Find(match)...)
	}
	return out
}

// Remove deletes every descendant element for which match is true and
// returns how many it removed.
func (n *Node) Remove(match func(*Node) bool) int {
	removed := 0
	kept := n.Children[:0]
	for _, c := range n.Children {
		if match(c) {
			removed++
			continue
		}
		removed += c.Remove(match)
		kept = append(kept, c)
	}
	n.Children = kept
	return removed
}

// String renders the tree canonically (sorted attributes, no whitespace
// text), one element per line, for equality checks and readable diffs.
func (n *Node) String() string {
	var b strings.Builder
	n.write(&b, 0)
	return b.String()
}

func (n *Node) write(b *strings.Builder, depth int) {
	b.WriteString(strings.Repeat("  ", depth))
	b.WriteString("<")
	if n.Name.Space != "" {
		b.WriteString("{" + n.Name.Space + "}")
	}
	b.WriteString(n.Name.Local)
	for _, a := range n.Attrs {
		b.WriteString(" ")
		if a.Name.Space != "" {
			b.WriteString("{" + a.Name.Space + "}")
		}
		fmt.Fprintf(b, "%s=%q", a.Name.Local, a.Value)
	}
	b.WriteString(">")
	if n.Text != "" {
		fmt.Fprintf(b, " %q", n.Text)
	}
	b.WriteString("\n")
	for _, c := range n.Children {
		c.write(b, depth+1)
	}
}

// IsEmptyElement reports an element with no attributes, text or children.
func IsEmptyElement(n *Node) bool {
	return len(n.Attrs) == 0 && n.Text == "" && len(n.Children) == 0
}
