package httpserve

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// phase is where a held connection is in its life.
type phase uint8

const (
	// waiting: accepted, every slot taken; it gets the next one freed.
	waiting phase = iota
	// header: served, its first request's headers not complete yet
	// (TLS handshake included).
	header
	// active: a request is being served (bounded by Read/WriteTimeout).
	active
	// idle: a keep-alive connection between requests (a later request's
	// headers being read still count as idle: net/http calls a connection
	// active only once the headers are in).
	idle
)

// limitListener replaces a plain connection cap (netutil.LimitListener),
// behind which connections waited in the kernel's accept queue with no
// deadline and the first MaxConns clients, idle or not, held every slot.
// It accepts at once and decides for each connection:
//   - one peer (an IPv4 address, an IPv6 /64) holds at most MaxConnsPerPeer
//     connections, waiting ones included: at its share, its own oldest idle
//     connection is closed to make room, else the new one is refused;
//   - with every slot taken, an idle connection is closed first (of the
//     peer holding most), else the oldest unfinished-headers connection of
//     a peer holding at least two more than the newcomer's, else the new
//     one waits (at most MaxConns wait; a full queue gives way the same
//     way, else the new one is refused);
//   - a connection whose first request's headers are not in
//     ReadHeaderTimeout after accept is closed, whether it waited or not
//     (net/http's own timeout starts when it starts reading, which a
//     connection waiting for a slot never reached).
//
// Every connection is held in phases net/http reports through ConnState.
type limitListener struct {
	net.Listener
	lim  Limits
	name string
	log  *slog.Logger

	done chan struct{} // closed when the accept loop ends; err says why
	err  error
	wake chan struct{} // a connection was queued for Accept

	mu       sync.Mutex
	conns    map[*conn]struct{} // every held connection (served or waiting)
	perPeer  map[string]int
	served   int
	queue    []*conn // given a slot, not yet returned by Accept
	closed   bool
	refused  int       // since the last warning
	lastWarn time.Time // at most one warning a minute
}

// conn is one held connection.
type conn struct {
	net.Conn
	l        *limitListener
	peer     string // "" (a unix socket): no per-peer share
	phase    phase
	accepted time.Time
	idleFrom time.Time
	timer    *time.Timer // the absolute header deadline
	gone     bool        // released: no longer counted
}

// peerKey is whose share a connection counts against: an IPv4 address, or
// an IPv6 address's /64 (one host is commonly given a whole /64). Other
// kinds (unix sockets: root's own commands) have no per-peer share.
func peerKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	if ip4 := ta.IP.To4(); ip4 != nil {
		return ip4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

func newLimitListener(ln net.Listener, lim Limits, name string, log *slog.Logger) *limitListener {
	l := &limitListener{
		Listener: ln, lim: lim, name: name, log: log,
		done: make(chan struct{}), wake: make(chan struct{}, 1),
		conns: map[*conn]struct{}{}, perPeer: map[string]int{},
	}
	go l.acceptLoop()
	return l
}

// acceptLoop accepts as fast as peers connect, so that no connection waits
// in the kernel's queue where no deadline reaches it.
func (l *limitListener) acceptLoop() {
	backoff := 5 * time.Millisecond
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			// Out of descriptors or memory: the connections stay in the
			// kernel's queue until some are freed.
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) {
				l.log.Warn("http accept failed, retrying", "server", l.name, "error", err, "retry_in", backoff)
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			close(l.done)
			return
		}
		backoff = 5 * time.Millisecond
		l.admit(nc)
	}
}

// admit decides what becomes of a new connection (see limitListener).
func (l *limitListener) admit(nc net.Conn) {
	now := time.Now()
	c := &conn{Conn: nc, l: l, peer: peerKey(nc.RemoteAddr()), accepted: now}
	var victims []*conn
	l.mu.Lock()
	ok := !l.closed
	if ok && c.peer != "" && l.perPeer[c.peer] >= l.lim.MaxConnsPerPeer {
		v := l.oldest(func(o *conn) bool { return o.peer == c.peer && o.phase == idle })
		if v == nil {
			v = l.oldest(func(o *conn) bool { return o.peer == c.peer && o.phase == waiting })
		}
		if v != nil {
			victims = append(victims, v)
			l.release(v)
		} else {
			ok = false
		}
	}
	if ok && l.served >= l.lim.MaxConns {
		if v := l.victim(c.peer, true); v != nil {
			victims = append(victims, v)
			l.release(v)
		}
	}
	if ok && l.served >= l.lim.MaxConns && len(l.conns)-l.served >= l.lim.MaxConns {
		if v := l.victim(c.peer, false); v != nil {
			victims = append(victims, v)
			l.release(v)
		} else {
			ok = false
		}
	}
	if ok {
		l.conns[c] = struct{}{}
		l.perPeer[c.peer]++
		if l.served < l.lim.MaxConns {
			l.grant(c)
		}
		c.timer = time.AfterFunc(l.lim.ReadHeaderTimeout, c.headerDeadline)
	} else {
		l.refused++
		if now.Sub(l.lastWarn) >= time.Minute {
			// Per peer it could be flooded; once a minute it cannot.
			l.log.Warn("http connections refused: a peer at its share, or every slot taken by requests in progress",
				"server", l.name, "peer", c.peer, "refused", l.refused, "max_conns", l.lim.MaxConns, "max_conns_per_peer", l.lim.MaxConnsPerPeer)
			l.lastWarn, l.refused = now, 0
		}
	}
	l.mu.Unlock()
	if !ok {
		nc.Close()
	}
	for _, v := range victims {
		v.Conn.Close()
	}
}

// oldest is the held connection longest in its phase among those match
// accepts. l.mu held.
func (l *limitListener) oldest(match func(*conn) bool) *conn {
	var best *conn
	for o := range l.conns {
		if match(o) && (best == nil || o.since().Before(best.since())) {
			best = o
		}
	}
	return best
}

func (c *conn) since() time.Time {
	if c.phase == idle {
		return c.idleFrom
	}
	return c.accepted
}

// victim picks the connection to close so that a newcomer of peer gets a
// slot (served true) or a place in the queue (false): an idle one first,
// of the peer holding most, longest idle; else one not yet past its
// headers (waiting ones for the queue) of a peer holding at least two more
// than peer does, so that a peer can only displace a bigger one. A request
// in progress is never closed. l.mu held.
func (l *limitListener) victim(peer string, served bool) *conn {
	var best *conn
	better := func(o *conn) bool {
		if best == nil {
			return true
		}
		if no, nb := l.perPeer[o.peer], l.perPeer[best.peer]; no != nb {
			return no > nb
		}
		return o.since().Before(best.since())
	}
	if served {
		for o := range l.conns {
			if o.phase == idle && better(o) {
				best = o
			}
		}
		if best != nil {
			return best
		}
	}
	mine := l.perPeer[peer]
	for o := range l.conns {
		if ((served && o.phase == header) || (!served && o.phase == waiting)) &&
			l.perPeer[o.peer] >= mine+2 && better(o) {
			best = o
		}
	}
	return best
}

// grant gives c a slot and queues it for Accept. l.mu held.
func (l *limitListener) grant(c *conn) {
	c.phase = header
	l.served++
	l.queue = append(l.queue, c)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// release stops counting c and gives its slot to the waiting connection of
// the peer holding least (the longest waiting among equals). The caller
// closes c's socket. l.mu held.
func (l *limitListener) release(c *conn) {
	if c.gone {
		return
	}
	c.gone = true
	if c.timer != nil {
		c.timer.Stop()
	}
	delete(l.conns, c)
	if l.perPeer[c.peer]--; l.perPeer[c.peer] <= 0 {
		delete(l.perPeer, c.peer)
	}
	if c.phase == waiting {
		return
	}
	l.served--
	var next *conn
	for o := range l.conns {
		if o.phase == waiting && (next == nil || l.perPeer[o.peer] < l.perPeer[next.peer] ||
			l.perPeer[o.peer] == l.perPeer[next.peer] && o.accepted.Before(next.accepted)) {
			next = o
		}
	}
	if next != nil && !l.closed {
		l.grant(next)
	}
}

// headerDeadline closes c if its first request's headers are not in yet.
func (c *conn) headerDeadline() {
	l := c.l
	l.mu.Lock()
	late := !c.gone && (c.phase == waiting || c.phase == header)
	if late {
		l.release(c)
	}
	l.mu.Unlock()
	if late {
		c.Conn.Close()
	}
}

// Close gives c's slot back (net/http, a hijacker, or an eviction).
func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.release(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// connState follows net/http's view of each connection (http.Server's
// ConnState); a TLS connection is followed through the one it wraps.
func (l *limitListener) connState(nc net.Conn, st http.ConnState) {
	if w, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = w.NetConn()
	}
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	var evict bool
	l.mu.Lock()
	if !c.gone {
		switch st {
		case http.StateActive, http.StateHijacked:
			c.phase = active
			c.timer.Stop()
		case http.StateIdle:
			c.phase = idle
			c.idleFrom = time.Now()
			// Idle first: a connection waits for a slot that an idle one
			// holds.
			if len(l.conns) > l.served {
				evict = true
				l.release(c)
			}
		}
	}
	l.mu.Unlock()
	if evict {
		c.Conn.Close()
	}
}

// Accept returns the connections given a slot, in order.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		for len(l.queue) > 0 {
			c := l.queue[0]
			l.queue = l.queue[1:]
			if !c.gone {
				l.mu.Unlock()
				return c, nil
			}
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-l.done:
			l.mu.Lock()
			err := l.err
			l.mu.Unlock()
			return nil, err
		}
	}
}

// Close stops accepting and closes the connections net/http has not taken
// (waiting, or queued for Accept); the ones it serves are its own.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	var drop []*conn
	for o := range l.conns {
		if o.phase == waiting {
			drop = append(drop, o)
		}
	}
	drop = append(drop, l.queue...)
	l.queue = nil
	for _, o := range drop {
		l.release(o)
	}
	l.mu.Unlock()
	for _, o := range drop {
		o.Conn.Close()
	}
	return err
}
