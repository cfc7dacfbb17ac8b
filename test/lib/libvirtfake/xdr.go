package libvirtfake

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Just enough XDR (RFC 4506) for the procedures the fake serves: 4-byte
// big-endian integers, length-prefixed strings padded to 4 bytes, fixed opaque.

type enc struct{ b []byte }

func (e *enc) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) i32(v int32)  { e.u32(uint32(v)) }
func (e *enc) str(s string) {
	e.u32(uint32(len(s)))
	e.b = append(e.b, s...)
	e.pad(len(s))
}
func (e *enc) fixed(p []byte) { e.b = append(e.b, p...); e.pad(len(p)) }
func (e *enc) pad(n int) {
	for ; n%4 != 0; n++ {
		e.b = append(e.b, 0)
	}
}

// optStr encodes libvirt's remote_string (a nullable string pointer).
func (e *enc) optStr(s *string) {
	if s == nil {
		e.u32(0)
		return
	}
	e.u32(1)
	e.str(*s)
}

var errShort = errors.New("xdr: short buffer")

type dec struct{ b []byte }

func (d *dec) u32() (uint32, error) {
	if len(d.b) < 4 {
		return 0, errShort
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v, nil
}

func (d *dec) str() (string, error) {
	n, err := d.u32()
	if err != nil {
		return "", err
	}
	padded := (int(n) + 3) &^ 3
	if int(n) < 0 || len(d.b) < padded {
		return "", fmt.Errorf("xdr: string of %d bytes: %w", n, errShort)
	}
	s := string(d.b[:n])
	d.b = d.b[padded:]
	return s, nil
}

func (d *dec) fixed(n int) ([]byte, error) {
	padded := (n + 3) &^ 3
	if len(d.b) < padded {
		return nil, errShort
	}
	p := append([]byte(nil), d.b[:n]...)
	d.b = d.b[padded:]
	return p, nil
}

// optStr decodes remote_string; libvirt's xdr_bool treats any non-zero
// discriminant as present.
func (d *dec) optStr() (*string, error) {
	present, err := d.u32()
	if err != nil {
		return nil, err
	}
	if present == 0 {
		return nil, nil
	}
	s, err := d.str()
	return &s, err
}

// domainRef is remote_nonnull_domain.
type domainRef struct {
	name string
	uuid [16]byte
	id   int32
}

func (e *enc) domain(r domainRef) {
	e.str(r.name)
	e.fixed(r.uuid[:])
	e.i32(r.id)
}

func (d *dec) domain() (domainRef, error) {
	var r domainRef
	var err error
	if r.name, err = d.str(); err != nil {
		return r, err
	}
	u, err := d.fixed(16)
	if err != nil {
		return r, err
	}
	copy(r.uuid[:], u)
	id, err := d.u32()
	r.id = int32(id)
	return r, err
}
