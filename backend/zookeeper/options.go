package zookeeper

import (
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// Defaults of Options and of the URL parameters.
const (
	DefaultPrefix         = "/fencelock"
	DefaultSessionTimeout = 15 * time.Second
	DefaultConnectTimeout = 10 * time.Second
)

// Options configures a Backend. A nil *Options means every default.
type Options struct {
	// Prefix is the znode under which every lock lives, as
	// PREFIX/<escaped key>/<contender znodes> (etcd's and Redis's Options
	// call their namespace Prefix too). It must be an absolute
	// ZooKeeper path; missing components are created as persistent znodes.
	// Default "/fencelock".
	Prefix string

	// SessionTimeout is the session timeout the server negotiated for the
	// connection given to New. Grants report it as their TTL and a third
	// of it as their validity (driver.Grant.Valid), so the engine never
	// trusts a lease for longer than the leader keeps the session (and
	// with it the lock) alive after the holder goes silent, even when a
	// follower cut off from the leader answered the renewal. Zero (the
	// default) means unknown: the engine's TTL must then be at most a
	// third of the session timeout. Open ignores this field and uses the
	// timeout the server actually granted.
	SessionTimeout time.Duration

	// ACL is the access control list of the znodes the backend creates.
	// Default zk.WorldACL(zk.PermAll).
	ACL []zk.ACL

	// Logger receives the backend's and go-zookeeper's diagnostics
	// (connection changes at Debug, clean-up failures at Warn). Default:
	// silent.
	Logger *slog.Logger
}

// Validate reports the first field out of range as a
// *driver.InvalidOptionError.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Prefix == "" {
		r.Prefix = DefaultPrefix
	}
	if err := validPrefix(r.Prefix); err != nil {
		return r, err
	}
	if r.SessionTimeout < 0 {
		return r, &driver.InvalidOptionError{Option: "SessionTimeout", Value: r.SessionTimeout.String(), Reason: "must not be negative"}
	}
	if r.ACL == nil {
		r.ACL = zk.WorldACL(zk.PermAll)
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

func validPrefix(root string) error {
	bad := func(reason string) error {
		return &driver.InvalidOptionError{Option: "Prefix", Value: strconv.Quote(root), Reason: reason}
	}
	if !strings.HasPrefix(root, "/") {
		return bad("must be an absolute znode path starting with /")
	}
	if root == "/" {
		return nil
	}
	if strings.HasSuffix(root, "/") {
		return bad("must not end with /")
	}
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return bad("is inside ZooKeeper's reserved /zookeeper tree")
	}
	for _, seg := range strings.Split(root[1:], "/") {
		switch {
		case seg == "":
			return bad("has an empty path segment")
		case seg == "." || seg == "..":
			return bad("has a . or .. segment")
		}
		for _, r := range seg {
			if r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0 {
				return bad("has a character ZooKeeper does not allow in paths")
			}
		}
	}
	return nil
}
