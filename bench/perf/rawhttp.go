package perf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// rawConn is one keep-alive HTTP/1.1 connection that sends prebuilt GET requests and
// reads just enough of each answer (status, Content-Length or chunks) to send the next:
// a load generator that costs a fraction of net/http's CPU, so that on a machine with
// two cores Envoy, not the client, is what saturates.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(addr string) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, br: bufio.NewReaderSize(c, 8<<10)}, nil
}

func (r *rawConn) Close() error { return r.c.Close() }

// do sends req (a whole HTTP/1.1 request) and returns the answer's status code.
func (r *rawConn) do(req []byte, deadline time.Time) (int, error) {
	_ = r.c.SetDeadline(deadline)
	if _, err := r.c.Write(req); err != nil {
		return 0, err
	}
	line, err := r.br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, fmt.Errorf("status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("status line %q", line)
	}
	length, chunked, closing := -1, false, false
	for {
		h, err := r.br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(h) <= 2 { // the blank line
			break
		}
		k, v, ok := bytes.Cut(bytes.TrimRight(h, "\r\n"), []byte(":"))
		if !ok {
			continue
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("content-length")):
			if length, err = strconv.Atoi(string(v)); err != nil {
				return 0, fmt.Errorf("content-length %q", v)
			}
		case bytes.EqualFold(k, []byte("transfer-encoding")):
			chunked = bytes.EqualFold(v, []byte("chunked"))
		case bytes.EqualFold(k, []byte("connection")):
			closing = bytes.EqualFold(v, []byte("close"))
		}
	}
	switch {
	case chunked:
		if err := r.skipChunks(); err != nil {
			return 0, err
		}
	case length > 0:
		if _, err := r.br.Discard(length); err != nil {
			return 0, err
		}
	case length < 0:
		return 0, errors.New("an answer without a length")
	}
	if closing {
		return status, io.ErrUnexpectedEOF // the caller dials again
	}
	return status, nil
}

func (r *rawConn) skipChunks() error {
	for {
		line, err := r.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.SplitN(line, []byte(";"), 2)[0])), 16, 64)
		if err != nil {
			return fmt.Errorf("chunk size %q", line)
		}
		if _, err := r.br.Discard(int(size) + 2); err != nil {
			return err
		}
		if size == 0 {
			return nil
		}
	}
}

// compareRequests are the comparison's requests, one per key: GET with the caller's key
// in x-api-key.
func compareRequests(keys int) [][]byte {
	out := make([][]byte, keys)
	for i := range out {
		out[i] = []byte("GET /v1/search?q=tollgate HTTP/1.1\r\nHost: api.example.com\r\nUser-Agent: tollgate-bench\r\nAccept: */*\r\n" +
			"x-api-key: ck-" + strconv.Itoa(i) + "\r\n\r\n")
	}
	return out
}

// RawBackend is an upstream that answers every HTTP/1.1 request on a keep-alive
// connection with 200 and a three-byte body, reading only the request's head (and a
// Content-Length body): the comparison's upstream, cheap enough that on two cores the
// CPU goes to Envoy rather than to the upstream. It returns its address and a stop
// function.
func RawBackend() (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	const answer = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"
	var conns sync.Map
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			go func() {
				defer conns.Delete(c)
				defer c.Close()
				br := bufio.NewReaderSize(c, 8<<10)
				for {
					length := 0
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(line) <= 2 {
							break
						}
						if k, v, ok := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(":")); ok && bytes.EqualFold(k, []byte("content-length")) {
							length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
						}
					}
					if length > 0 {
						if _, err := br.Discard(length); err != nil {
							return
						}
					}
					if _, err := io.WriteString(c, answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), func() {
		l.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	}, nil
}
