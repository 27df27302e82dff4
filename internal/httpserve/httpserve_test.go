package httpserve

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestWithDefaults(t *testing.T) {
	l := Limits{MaxConns: 3, IdleTimeout: time.Second}.WithDefaults()
	want := Defaults
	want.MaxConns, want.MaxConnsPerPeer, want.IdleTimeout = 3, 3, time.Second
	if l != want {
		t.Fatalf("WithDefaults = %+v, want %+v", l, want)
	}
}

// With the cap reached a third client is answered at once and the longest
// idle connection is closed for it; idle ones are closed after
// IdleTimeout; a client that never finishes its headers is closed after
// ReadHeaderTimeout.
func TestServeBounds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	idle := 300 * time.Millisecond
	s := Serve(ln, h, Limits{MaxConns: 2, IdleTimeout: idle, ReadHeaderTimeout: idle}, "test", slog.New(slog.DiscardHandler))
	defer s.Close()

	// request sends one keep-alive request on a new connection; the
	// returned channel gets the status line, then the time gpud closed it.
	request := func() (net.Conn, chan string) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		ch := make(chan string, 2)
		go func() {
			rd := bufio.NewReader(c)
			line, _ := rd.ReadString('\n')
			ch <- strings.TrimSpace(line)
			io.Copy(io.Discard, rd)
			ch <- "closed"
		}()
		return c, ch
	}
	c1, ch1 := request()
	defer c1.Close()
	if got := <-ch1; !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("status %q", got)
	}
	c2, ch2 := request()
	defer c2.Close()
	if got := <-ch2; !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("status %q", got)
	}
	c3, ch3 := request()
	defer c3.Close()
	select {
	case got := <-ch3:
		if !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("third client: %q", got)
		}
	case <-time.After(idle / 2):
		t.Fatal("third client not answered while two idle connections held the slots")
	}
	select {
	case <-ch1:
	case <-time.After(idle / 2):
		t.Fatal("the longest idle connection was not closed for the third client")
	}
	for _, ch := range []chan string{ch2, ch3} {
		select {
		case <-ch:
		case <-time.After(5 * idle):
			t.Fatal("an idle keep-alive connection was not closed")
		}
	}

	// Headers never finished.
	slow, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "GET / HTTP/1.1\r\nHost:")
	slow.SetReadDeadline(time.Now().Add(5 * idle))
	if _, err := io.Copy(io.Discard, slow); err != nil {
		t.Fatalf("a client with unfinished headers was not closed: %v", err)
	}
}
