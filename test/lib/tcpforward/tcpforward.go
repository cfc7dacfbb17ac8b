// Package tcpforward forwards TCP connections: the tiers answer an address
// no process of theirs serves (the kubernetes Service IP without
// kube-proxy) by copying to the one that does.
package tcpforward

import (
	"io"
	"net"
)

// Serve accepts on l until l is closed and copies each connection both
// ways to a new connection to target; a connection ends when either side
// ends it. A connection target refuses is closed.
func Serve(l net.Listener, target string) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go forward(c, target)
		}
	}()
}

func forward(c net.Conn, target string) {
	defer c.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
