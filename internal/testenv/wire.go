package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The readiness probes and the few commands testenv sends speak each
// server's own protocol, with the standard library only: a probe passes
// when the server really serves requests, not when its port is open.

// probeTimeout bounds one probe or command.
const probeTimeout = 3 * time.Second

// dial connects to addr with a deadline of probeTimeout for the whole
// exchange.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	return dialWithin(ctx, addr, probeTimeout)
}

// dialWithin is dial with a deadline of bound: for a command that may
// rightly take longer than a probe (a MIGRATE on a loaded machine).
func dialWithin(ctx context.Context, addr string, bound time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(deadline)
	}
	return c, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// ---------------------------------------------------------------- ZooKeeper

// zkFourLetter sends a four-letter word (srvr, ruok) and returns the answer.
func zkFourLetter(ctx context.Context, addr, word string) (string, error) {
	c, err := dial(ctx, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := io.WriteString(c, word); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 1<<16))
	if err != nil && len(b) == 0 {
		return "", err
	}
	return string(b), nil
}

// zkMode returns the Mode of a ZooKeeper server's srvr answer (standalone,
// leader, follower), or an error when it does not serve.
func zkMode(ctx context.Context, addr string) (string, error) {
	out, err := zkFourLetter(ctx, addr, "srvr")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("srvr answered %q", firstLine(out))
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}

// ---------------------------------------------------------------- Redis

// respErr is an error reply of a Redis server.
type respErr string

func (e respErr) Error() string { return string(e) }

// redisDo sends one command and returns its reply: a string (simple or
// bulk), an int64, nil, or a []any of those.
func redisDo(ctx context.Context, addr string, args ...string) (any, error) {
	return redisDoWithin(ctx, addr, probeTimeout, args...)
}

// redisDoWithin is redisDo with a deadline of bound for the exchange.
func redisDoWithin(ctx context.Context, addr string, bound time.Duration, args ...string) (any, error) {
	c, err := dialWithin(ctx, addr, bound)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return nil, err
	}
	v, err := readRESP(bufio.NewReader(c), 0)
	if err != nil {
		return nil, err
	}
	if e, ok := v.(respErr); ok {
		return nil, e
	}
	return v, nil
}

func readRESP(r *bufio.Reader, depth int) (any, error) {
	if depth > 8 {
		return nil, errors.New("RESP reply nested too deep")
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return respErr(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, 0, n)
		for range n {
			v, err := readRESP(r, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected RESP line %q", line)
}

// redisPing passes when the server answers PING with PONG.
func redisPing(ctx context.Context, addr string) error {
	v, err := redisDo(ctx, addr, "PING")
	if err != nil {
		return err
	}
	if v != "PONG" {
		return fmt.Errorf("PING answered %v", v)
	}
	return nil
}

// ---------------------------------------------------------------- HTTP (etcd)

var httpClient = &http.Client{
	Timeout:   probeTimeout,
	Transport: &http.Transport{DisableKeepAlives: true},
}

func httpDo(ctx context.Context, method, url, body string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	return b, nil
}

// etcdHealth passes when the member's /health says true (it sees a leader).
func etcdHealth(ctx context.Context, addr string) error {
	b, err := httpDo(ctx, http.MethodGet, "http://"+addr+"/health", "")
	if err != nil {
		return err
	}
	var h struct {
		Health string `json:"health"`
	}
	if err := json.Unmarshal(b, &h); err != nil || h.Health != "true" {
		return fmt.Errorf("/health answered %q", bytes.TrimSpace(b))
	}
	return nil
}

// etcdIsLeader asks a member (Maintenance.Status through etcd's JSON
// gateway) whether it is the raft leader.
func etcdIsLeader(ctx context.Context, addr string) (bool, error) {
	b, err := httpDo(ctx, http.MethodPost, "http://"+addr+"/v3/maintenance/status", "{}")
	if err != nil {
		return false, err
	}
	var st struct {
		Header struct {
			MemberID string `json:"member_id"`
		} `json:"header"`
		Leader string `json:"leader"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return false, err
	}
	return st.Header.MemberID != "" && st.Header.MemberID == st.Leader, nil
}

// ---------------------------------------------------------------- MongoDB wire protocol

// bsonDoc encodes a flat BSON document of int32 and string values, in
// order: pairs of key, value.
func bsonDoc(kv ...any) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0, 0})
	for i := 0; i+1 < len(kv); i += 2 {
		k := kv[i].(string)
		switch v := kv[i+1].(type) {
		case int32:
			b.WriteByte(0x10)
			b.WriteString(k)
			b.WriteByte(0)
			_ = binary.Write(&b, binary.LittleEndian, v)
		case string:
			b.WriteByte(0x02)
			b.WriteString(k)
			b.WriteByte(0)
			_ = binary.Write(&b, binary.LittleEndian, int32(len(v)+1))
			b.WriteString(v)
			b.WriteByte(0)
		}
	}
	b.WriteByte(0)
	out := b.Bytes()
	binary.LittleEndian.PutUint32(out, uint32(len(out)))
	return out
}

// bsonFields returns the top-level fields of a BSON document that are
// numbers (as float64) or strings; others are skipped.
func bsonFields(doc []byte) (map[string]any, error) {
	if len(doc) < 5 || int(binary.LittleEndian.Uint32(doc)) != len(doc) {
		return nil, errors.New("bad BSON document length")
	}
	out := map[string]any{}
	p := doc[4 : len(doc)-1]
	for len(p) > 0 {
		typ := p[0]
		end := bytes.IndexByte(p[1:], 0)
		if end < 0 {
			return nil, errors.New("bad BSON key")
		}
		key := string(p[1 : 1+end])
		p = p[2+end:]
		var size int
		switch typ {
		case 0x01, 0x09, 0x11, 0x12: // double, datetime, timestamp, int64
			size = 8
		case 0x10: // int32
			size = 4
		case 0x08: // bool
			size = 1
		case 0x0A: // null
			size = 0
		case 0x07: // ObjectId
			size = 12
		case 0x13: // decimal128
			size = 16
		case 0x02, 0x03, 0x04, 0x05: // string, document, array, binary
			if len(p) < 4 {
				return nil, errors.New("short BSON value")
			}
			size = int(binary.LittleEndian.Uint32(p))
			switch typ {
			case 0x02:
				size += 4
			case 0x05:
				size += 5
			}
		default:
			return nil, fmt.Errorf("BSON type 0x%02x not supported", typ)
		}
		if size < 0 || size > len(p) {
			return nil, errors.New("short BSON value")
		}
		v := p[:size]
		switch typ {
		case 0x01:
			out[key] = math.Float64frombits(binary.LittleEndian.Uint64(v))
		case 0x10:
			out[key] = float64(int32(binary.LittleEndian.Uint32(v)))
		case 0x12:
			out[key] = float64(int64(binary.LittleEndian.Uint64(v)))
		case 0x08:
			out[key] = v[0] == 1
		case 0x02:
			out[key] = string(v[4 : len(v)-1])
		default:
			out[key] = nil
		}
		p = p[size:]
	}
	return out, nil
}

// mongoCommand sends one command (OP_MSG) and returns the reply's
// top-level fields.
func mongoCommand(ctx context.Context, addr string, cmd []byte) (map[string]any, error) {
	c, err := dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg := make([]byte, 16+4+1, 16+4+1+len(cmd))
	msg = append(msg, cmd...)
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[4:], 1)     // requestID
	binary.LittleEndian.PutUint32(msg[12:], 2013) // OP_MSG
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	var hdr [16]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr[:]))
	if n < 16+5 || n > 48<<20 || binary.LittleEndian.Uint32(hdr[12:]) != 2013 {
		return nil, errors.New("not an OP_MSG reply")
	}
	body := make([]byte, n-16)
	if _, err := io.ReadFull(c, body); err != nil {
		return nil, err
	}
	if body[4] != 0 {
		return nil, errors.New("OP_MSG reply without a body section first")
	}
	return bsonFields(body[5:])
}

// mongoReady passes when the server answers hello with its wire versions,
// and, if db is not "", runs listCollections on db with ok: 1 (for FerretDB
// on PostgreSQL, that needs its backend to work too).
func mongoReady(ctx context.Context, addr, db string) error {
	f, err := mongoCommand(ctx, addr, bsonDoc("hello", int32(1), "$db", "admin"))
	if err != nil {
		return err
	}
	if _, ok := f["maxWireVersion"]; !ok {
		return fmt.Errorf("hello answered %v", f)
	}
	if db == "" {
		return nil
	}
	f, err = mongoCommand(ctx, addr, bsonDoc("listCollections", int32(1), "$db", db))
	if err != nil {
		return err
	}
	if f["ok"] != 1.0 {
		return fmt.Errorf("listCollections answered %v", f)
	}
	return nil
}

// ---------------------------------------------------------------- PostgreSQL

// pgConn is a connection speaking PostgreSQL's frontend/backend protocol
// v3, enough for simple queries: trust, cleartext and md5 authentication.
type pgConn struct {
	c net.Conn
	r *bufio.Reader
}

// pgError is an ErrorResponse of the server.
type pgError struct{ Code, Message string }

func (e *pgError) Error() string { return fmt.Sprintf("%s (SQLSTATE %s)", e.Message, e.Code) }

func pgConnect(ctx context.Context, addr, user, password, db string) (*pgConn, error) {
	c, err := dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	pc := &pgConn{c: c, r: bufio.NewReader(c)}
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0, 0, 0, 3, 0, 0})
	for _, s := range []string{"user", user, "database", db} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	b.WriteByte(0)
	startup := b.Bytes()
	binary.BigEndian.PutUint32(startup, uint32(len(startup)))
	if _, err := c.Write(startup); err != nil {
		c.Close()
		return nil, err
	}
	for {
		typ, msg, err := pc.read()
		if err != nil {
			c.Close()
			return nil, err
		}
		switch typ {
		case 'R':
			if len(msg) < 4 {
				c.Close()
				return nil, errors.New("short authentication message")
			}
			switch code := binary.BigEndian.Uint32(msg); code {
			case 0: // ok
			case 3: // cleartext
				err = pc.send('p', password+"\x00")
			case 5: // md5
				if len(msg) < 8 {
					c.Close()
					return nil, errors.New("short md5 salt")
				}
				inner := md5.Sum([]byte(password + user))
				outer := md5.Sum(append([]byte(hex.EncodeToString(inner[:])), msg[4:8]...))
				err = pc.send('p', "md5"+hex.EncodeToString(outer[:])+"\x00")
			default:
				err = fmt.Errorf("authentication method %d not supported by testenv", code)
			}
			if err != nil {
				c.Close()
				return nil, err
			}
		case 'E':
			c.Close()
			return nil, parsePGError(msg)
		case 'Z':
			return pc, nil
		}
	}
}

func (pc *pgConn) Close() error { return pc.c.Close() }

func (pc *pgConn) send(typ byte, body string) error {
	msg := make([]byte, 5, 5+len(body))
	msg[0] = typ
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(body)))
	msg = append(msg, body...)
	_, err := pc.c.Write(msg)
	return err
}

func (pc *pgConn) read() (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(pc.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:]))
	if n < 4 || n > 16<<20 {
		return 0, nil, errors.New("bad PostgreSQL message length")
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(pc.r, body); err != nil {
		return 0, nil, err
	}
	return hdr[0], body, nil
}

func parsePGError(msg []byte) error {
	e := &pgError{}
	for _, f := range bytes.Split(msg, []byte{0}) {
		if len(f) < 1 {
			continue
		}
		switch f[0] {
		case 'C':
			e.Code = string(f[1:])
		case 'M':
			e.Message = string(f[1:])
		}
	}
	return e
}

// query runs one simple query and returns its rows as text (NULL as "").
func (pc *pgConn) query(q string) ([][]string, error) {
	if err := pc.send('Q', q+"\x00"); err != nil {
		return nil, err
	}
	var rows [][]string
	var qerr error
	for {
		typ, msg, err := pc.read()
		if err != nil {
			return nil, err
		}
		switch typ {
		case 'D':
			if len(msg) < 2 {
				return nil, errors.New("short DataRow")
			}
			n := int(binary.BigEndian.Uint16(msg))
			p := msg[2:]
			row := make([]string, 0, n)
			for range n {
				if len(p) < 4 {
					return nil, errors.New("short DataRow")
				}
				l := int(int32(binary.BigEndian.Uint32(p)))
				p = p[4:]
				if l < 0 {
					row = append(row, "")
					continue
				}
				if l > len(p) {
					return nil, errors.New("short DataRow")
				}
				row = append(row, string(p[:l]))
				p = p[l:]
			}
			rows = append(rows, row)
		case 'E':
			qerr = parsePGError(msg)
		case 'Z':
			return rows, qerr
		}
	}
}

// pgAddr is where a PostgreSQL URL points, and as whom.
type pgAddr struct {
	hostport, user, password, db string
}

func (a pgAddr) connect(ctx context.Context, db string) (*pgConn, error) {
	if db == "" {
		db = a.db
	}
	return pgConnect(ctx, a.hostport, a.user, a.password, db)
}

// pgPing passes when a session can run SELECT 1 (not while the server
// starts up, recovers or shuts down).
func pgPing(ctx context.Context, a pgAddr, db string) error {
	c, err := a.connect(ctx, db)
	if err != nil {
		return err
	}
	defer c.Close()
	rows, err := c.query("SELECT 1")
	if err != nil {
		return err
	}
	if len(rows) != 1 || len(rows[0]) != 1 || rows[0][0] != "1" {
		return fmt.Errorf("SELECT 1 returned %v", rows)
	}
	return nil
}

// pgCreateDatabase creates database name unless it exists. name must be a
// plain identifier (it is checked, then spliced into the statement).
func pgCreateDatabase(ctx context.Context, a pgAddr, name string) error {
	if !plainIdent(name) {
		return fmt.Errorf("testenv: %q is not a plain database name", name)
	}
	c, err := a.connect(ctx, "")
	if err != nil {
		return err
	}
	defer c.Close()
	rows, err := c.query("SELECT 1 FROM pg_database WHERE datname = '" + name + "'")
	if err != nil {
		return err
	}
	if len(rows) == 1 {
		return nil
	}
	_, err = c.query("CREATE DATABASE " + name)
	var pe *pgError
	if errors.As(err, &pe) && pe.Code == "42P04" { // duplicate_database: made meanwhile
		return nil
	}
	return err
}

func plainIdent(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
