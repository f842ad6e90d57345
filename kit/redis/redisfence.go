// Package redisfence applies fencelock's fencing rule inside Redis: one
// script checks a write's token against the resource's fence, records it,
// and runs your commands, in one atomic step, so that a paused holder's
// late write can never land after the next holder's.
//
// The rule, from docs/fencing.md
// (https://github.com/fencelock/fencelock/blob/main/docs/fencing.md):
// a write carrying token T from holder H is accepted if T is greater than
// the highest token the resource has accepted, or if T equals that highest
// token and H is the holder that presented it; an accepted write records T
// and H; anything else is refused and changes nothing. Token 0 is never
// accepted.
//
// Do runs the write: a refused token returns a *fencelock.StaleTokenError,
// which matches fencelock.ErrStaleToken, and runs none of the commands.
// Tokens travel and are compared as decimal strings (longer is higher; of
// equal length, bytewise), never as Lua numbers, which are exact only up
// to 2^53: every 64-bit token is exact.
//
// # Keys and Redis Cluster
//
// The fence of a resource is a hash {token, owner} at FenceKey(resource),
// which carries the resource's hash tag, Tag(resource): the resource's own
// tag if it has one ("{acct:1}:balance" has the tag "acct:1"), else the
// whole resource ("acct:1"). Every key a fenced write touches must carry
// the same tag ("{acct:1}:balance", "{acct:1}:history"), so that all of
// them hash to one Cluster slot and the script can run on one node; Do
// refuses any other key with a *HashTagError before anything runs. The
// check is the same on a single server, so code that works there works on
// a Cluster.
//
// # Why a script, not a Redis function
//
// The kit runs one Lua script with EVALSHA, falling back to EVAL when a
// server does not have it cached (go-redis's Script.Run). A Redis function
// would have to be installed with FUNCTION LOAD (Redis 7 or later, on
// every primary, kept at the right version across upgrades, and not
// allowed on some managed services) before the first write; the script
// needs nothing installed, works on Redis 2.6 and later and on Valkey, and
// is cached by each node on first use.
//
// # From a shell
//
// The script is the file fence.lua in this package's directory, also
// Source. A job under `fencelock run` runs it with redis-cli, the fence
// key and the commands' keys before a lone comma, the token, the holder
// and the commands (count, then name, number of keys, number of
// arguments, arguments) after it:
//
//	redis-cli -e --eval fence.lua '{acct:1}:fencelock:fence:acct:1' '{acct:1}:balance' , \
//	  "$FENCELOCK_TOKEN" "$FENCELOCK_OWNER" 1 INCRBY 1 1 100
//
// A refused token is the error "STALE stale fencing token T (highest
// accepted H)", which makes redis-cli -e exit 1, having written nothing.
//
// # Atomicity
//
// A refused write changes nothing. An accepted write records the fence,
// then runs the commands in order; a command that fails at run time (a
// wrong type, a syntax error) stops the script with a *CommandError, and,
// as with MULTI/EXEC, Redis does not roll back: the fence record and the
// commands before the failed one have taken effect.
package redisfence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
)

// Cmd is one Redis command of a fenced write, run in the script as
// redis.call(Name, Keys..., Args...). Use write commands whose keys come
// first (SET, HSET, DEL, INCRBY, LPUSH, EXPIRE, ...); commands Redis does
// not allow in scripts (blocking ones, MULTI, EVAL, ...) fail with a
// *CommandError.
type Cmd struct {
	// Name is the command, such as "SET".
	Name string
	// Keys are the keys it touches, first in its arguments. Each must
	// carry the resource's hash tag (see Tag).
	Keys []string
	// Args follow the keys: strings, []byte, numbers or bools, as go-redis
	// writes them.
	Args []any
}

// ErrHashTag is matched by every *HashTagError.
var ErrHashTag = errors.New("redisfence: key outside the resource's hash tag")

// HashTagError reports a key that does not carry the hash tag of the
// resource being fenced, or a resource no tag can be derived from. Nothing
// was run. It matches ErrHashTag.
type HashTagError struct {
	// Resource is the fenced resource.
	Resource string
	// Key is the key without the tag; empty when the resource itself has
	// no usable tag.
	Key string
	// Tag is the resource's hash tag; empty when it has none.
	Tag string
}

// Error implements error.
func (e *HashTagError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("redisfence: resource %q has no usable hash tag: name it without '}' outside a tag, or give it a tag such as {name}", e.Resource)
	}
	return fmt.Sprintf("redisfence: key %q does not carry {%s}, the hash tag of resource %q: every key of a fenced write must, so that all hash to the fence's Cluster slot (name it like {%s}:data)",
		e.Key, e.Tag, e.Resource, e.Tag)
}

// Is reports whether target is ErrHashTag.
func (e *HashTagError) Is(target error) bool { return target == ErrHashTag }

// CommandError reports a command of an accepted write that failed when the
// script ran it. The fence was recorded and the commands before it took
// effect: Redis scripts do not roll back.
type CommandError struct {
	// Resource is the fenced resource.
	Resource string
	// Index is the failed command's index in the commands given to Do.
	Index int
	// Name is the failed command's name.
	Name string
	// Message is Redis's error.
	Message string
}

// Error implements error.
func (e *CommandError) Error() string {
	return fmt.Sprintf("redisfence: command %d (%s) of the fenced write to %q failed after the fence was recorded and the commands before it ran (Redis does not roll back): %s",
		e.Index, e.Name, e.Resource, e.Message)
}

// keyTag returns key's hash tag as Redis Cluster computes it: the text
// between the first '{' and the first '}' after it, if not empty.
func keyTag(key string) (string, bool) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return "", false
	}
	return key[i+1 : i+1+j], true
}

// Tag returns the hash tag every key of a fenced write to resource must
// carry, as "{" + tag + "}": resource's own hash tag if it has one, else
// resource itself. A resource that is empty, or has no tag and contains
// '}', has no usable tag: Tag returns a *HashTagError.
func Tag(resource string) (string, error) {
	if t, ok := keyTag(resource); ok {
		return t, nil
	}
	if resource == "" || strings.IndexByte(resource, '}') >= 0 {
		return "", &HashTagError{Resource: resource}
	}
	return resource, nil
}

// FenceKey returns the key of resource's fence, a hash {token, owner}:
// "{" + Tag(resource) + "}:fencelock:fence:" + resource.
func FenceKey(resource string) (string, error) {
	tag, err := Tag(resource)
	if err != nil {
		return "", err
	}
	return "{" + tag + "}:fencelock:fence:" + resource, nil
}

// Source is the Lua script a fenced write runs (the kit's fence.lua):
// it checks and records the fence, then runs the commands, and is what a
// shell job runs with redis-cli --eval. Its comment describes its keys
// and arguments: KEYS[1] the fence (FenceKey), KEYS[2..] the commands'
// keys in order; ARGV[1] the token (decimal), ARGV[2] the holder, ARGV[3]
// the number of commands, then per command its name, number of keys,
// number of arguments and the arguments. It returns {1, replies...} when
// the write was accepted, the error "STALE ... (highest accepted H)" when
// the rule refused it, and the error "FENCECMD command I failed ...: E"
// when command I failed.
//
//go:embed fence.lua
var Source string

// script is Source, run with EVALSHA.
var script = redis.NewScript(Source)

// staleRE and cmdRE parse the script's error replies.
var (
	staleRE = regexp.MustCompile(`^STALE .*\(highest accepted (\d+)\)$`)
	cmdRE   = regexp.MustCompile(`^FENCECMD command (\d+) failed [^:]*: (.*)$`)
)

// Do runs cmds on rdb (a *redis.Client, *redis.ClusterClient or
// *redis.Ring) as one write fenced for resource: in one script, it checks
// token and holder (a lease's Token and Owner) against resource's fence by
// the fencing rule, records them, and runs cmds in order. It returns the
// commands' replies, in order (a nil reply as nil).
//
// A refused token runs nothing and returns a *fencelock.StaleTokenError
// (Highest is the resource's highest accepted token), which matches
// fencelock.ErrStaleToken. A key without resource's hash tag returns a
// *HashTagError and a command with no name an error, before anything
// runs; a command that fails when run returns a *CommandError (see the
// package doc on atomicity). Do with no cmds checks and records the fence
// only.
func Do(ctx context.Context, rdb redis.Scripter, resource string, token fencelock.Token, holder string, cmds ...Cmd) ([]any, error) {
	tag, err := Tag(resource)
	if err != nil {
		return nil, err
	}
	keys := []string{"{" + tag + "}:fencelock:fence:" + resource}
	args := []any{strconv.FormatUint(uint64(token), 10), holder, len(cmds)}
	for i, c := range cmds {
		if c.Name == "" {
			return nil, fmt.Errorf("redisfence: command %d of the fenced write to %q has no name: set Cmd.Name", i, resource)
		}
		for _, k := range c.Keys {
			if t, ok := keyTag(k); !ok || t != tag {
				return nil, &HashTagError{Resource: resource, Key: k, Tag: tag}
			}
		}
		keys = append(keys, c.Keys...)
		args = append(args, c.Name, len(c.Keys), len(c.Args))
		args = append(args, c.Args...)
	}
	res, err := script.Run(ctx, rdb, keys, args...).Slice()
	if err != nil {
		return nil, scriptError(resource, token, cmds, err)
	}
	return decode(resource, cmds, res)
}

// scriptError turns the script's error replies into the kit's errors.
func scriptError(resource string, token fencelock.Token, cmds []Cmd, err error) error {
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		if m := staleRE.FindStringSubmatch(msg); m != nil {
			if high, err := strconv.ParseUint(m[1], 10, 64); err == nil {
				return &fencelock.StaleTokenError{Resource: resource, Token: token, Highest: fencelock.Token(high)}
			}
		}
		if m := cmdRE.FindStringSubmatch(msg); m != nil {
			if i, err := strconv.Atoi(m[1]); err == nil && i < len(cmds) {
				return &CommandError{Resource: resource, Index: i, Name: cmds[i].Name, Message: m[2]}
			}
		}
	}
	return fmt.Errorf("redisfence: fenced write to %q: %w", resource, err)
}

// decode turns the script's reply to an accepted write into Do's
// results.
func decode(resource string, cmds []Cmd, res []any) ([]any, error) {
	if len(res) != 1+len(cmds) || res[0] != int64(1) {
		return nil, fmt.Errorf("redisfence: fenced write to %q: unexpected script reply %v", resource, res)
	}
	out := res[1:]
	for i, r := range out {
		if b, ok := r.(bool); ok && !b {
			// A nil reply reaches Lua as false, which a RESP3
			// connection returns as a boolean.
			out[i] = nil
		}
	}
	return out, nil
}
