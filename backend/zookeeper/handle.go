package zookeeper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// A grant's Handle is "VERSION:TOKEN:OWNERTAG:PATH": the holder znode's data
// version and zxid token when the grant was issued, a hash of the owner,
// and the znode path. Renew and Release check Owner and Token against it
// locally and the version on the server, so each is one round trip.
// VERSION "uA" marks a grant of AcquireWait that the engine's Renew has yet
// to confirm; A is the parent's ACL version when the znode was created
// (see markedSet).
type handle struct {
	version     int32
	token       int64
	tag         string
	path        string
	unconfirmed bool
	aversion    int32
}

func ownerTag(owner string) string {
	s := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(s[:8])
}

func (h handle) String() string {
	if h.unconfirmed {
		return fmt.Sprintf("u%d:%d:%s:%s", h.aversion, h.token, h.tag, h.path)
	}
	return fmt.Sprintf("%d:%d:%s:%s", h.version, h.token, h.tag, h.path)
}

func parseHandle(s string) (handle, bool) {
	parts := strings.SplitN(s, ":", 4)
	if len(parts) != 4 || !strings.HasPrefix(parts[3], "/") {
		return handle{}, false
	}
	h := handle{tag: parts[2], path: parts[3]}
	var err1, err2 error
	if a, ok := strings.CutPrefix(parts[0], "u"); ok {
		h.unconfirmed = true
		var v int64
		v, err1 = strconv.ParseInt(a, 10, 32)
		h.aversion = int32(v)
	} else {
		var v int64
		v, err1 = strconv.ParseInt(parts[0], 10, 32)
		h.version = int32(v)
	}
	h.token, err2 = strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return handle{}, false
	}
	return h, true
}

func (b *Backend) grant(key, owner, node string, version int32, token int64) driver.Grant {
	return driver.Grant{
		Key:    key,
		Owner:  owner,
		Token:  driver.Token(token),
		TTL:    b.SessionTimeout(), // what the leader keeps the znode for
		Valid:  b.confirmedTTL(),   // what the answer vouches for
		Handle: handle{version: version, token: token, tag: ownerTag(owner), path: node}.String(),
	}
}

// ownHandle returns g's handle if it is consistent with g's Owner and
// Token; a forged or mixed-up grant gets ok false. A grant without a
// handle (the engine's clean-up after an ambiguous acquire builds one from
// Inspect) is looked up on the server.
func (b *Backend) ownHandle(ctx context.Context, g driver.Grant) (handle, bool, error) {
	if g.Handle == "" {
		return b.lookup(ctx, g)
	}
	h, ok := parseHandle(g.Handle)
	if !ok || h.tag != ownerTag(g.Owner) || h.token != int64(g.Token) || g.Token == 0 {
		return handle{}, false, nil
	}
	if !strings.HasPrefix(h.path, b.parent(g.Key)+"/") {
		return handle{}, false, nil
	}
	return h, true, nil
}

// lookup finds the holder znode of g.Key and checks it is g's.
func (b *Backend) lookup(ctx context.Context, g driver.Grant) (handle, bool, error) {
	if driver.ValidateKey(g.Key) != nil {
		return handle{}, false, nil
	}
	node, data, st, err := b.holder(ctx, b.parent(g.Key))
	if err != nil || node == "" {
		return handle{}, false, err
	}
	if ownerOf(data) != g.Owner || st.Mzxid != int64(g.Token) {
		return handle{}, false, nil
	}
	return handle{version: st.Version, token: st.Mzxid, tag: ownerTag(g.Owner), path: node}, true, nil
}

// holder returns the lowest contender znode under parent, with its data
// and Stat; node is "" if there is none.
func (b *Backend) holder(ctx context.Context, parent string) (node string, data []byte, st *zk.Stat, err error) {
	for range 5 {
		names, _, err := b.conn.Children(ctx, parent)
		if errors.Is(err, zk.ErrNoNode) {
			return "", nil, nil, nil
		}
		if err != nil {
			return "", nil, nil, err
		}
		cs := sortChildren(names)
		if len(cs) == 0 {
			return "", nil, nil, nil
		}
		node = parent + "/" + cs[0].name
		data, st, err = b.conn.Get(ctx, node)
		if errors.Is(err, zk.ErrNoNode) {
			continue // it just went: look again
		}
		if err != nil {
			return "", nil, nil, err
		}
		return node, data, st, nil
	}
	return "", nil, nil, errors.New("zookeeper: the lock's queue kept changing while being read")
}
