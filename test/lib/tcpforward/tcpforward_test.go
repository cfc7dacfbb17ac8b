package tcpforward

import (
	"bufio"
	"net"
	"testing"
)

// Bytes go both ways through the forward, and closing the listener stops
// new connections.
func TestServeCopiesBothWays(t *testing.T) {
	t.Parallel()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("echo " + line))
			}()
		}
	}()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	Serve(l, echo.Addr().String())
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "echo hello\n" {
		t.Fatalf("through the forward: %q, %v; want %q", got, err, "echo hello\n")
	}
	l.Close()
	if c2, err := net.Dial("tcp", l.Addr().String()); err == nil {
		c2.Close()
		t.Error("the forward still accepts after its listener closed")
	}
}
