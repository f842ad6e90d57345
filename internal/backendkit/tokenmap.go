package backendkit

import (
	"context"
	"errors"

	"github.com/fencelock/fencelock/driver"
)

// TokenMap is a backend's translation between the tokens it hands out and
// its store's native ones (etcd revisions, ZooKeeper zxids, each plus a
// token-floor offset). Native maps a grant the backend issued back to its
// native grant (driver.ErrNotHeld if its token maps to none); Token maps
// a native token to the one handed out.
type TokenMap struct {
	Native func(ctx context.Context, g driver.Grant) (driver.Grant, error)
	Token  func(ctx context.Context, native int64) (driver.Token, error)
}

// Renew renews g through renew, which works on native grants: a renewal
// that kept the native token keeps g's token, a new native token (a
// rotation) is mapped.
func (m TokenMap) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest,
	renew func(context.Context, driver.Grant, driver.RenewRequest) (driver.Grant, error)) (driver.Grant, error) {
	n, err := m.Native(ctx, g)
	if err != nil {
		return driver.Grant{}, err
	}
	r, err := renew(ctx, n, req)
	if err != nil {
		return driver.Grant{}, err
	}
	if r.Token == n.Token {
		r.Token = g.Token
	} else if r.Token, err = m.Token(ctx, int64(r.Token)); err != nil {
		return driver.Grant{}, err
	}
	return r, nil
}

// RenewBatch is Renew for a batch: grants are mapped to native ones,
// renewed by renewBatch, and each result's token mapped back as Renew
// does; a result whose token cannot be mapped fails alone.
func (m TokenMap) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest,
	renewBatch func(context.Context, []driver.Grant, driver.RenewRequest) ([]driver.RenewResult, error)) ([]driver.RenewResult, error) {
	ns := make([]driver.Grant, len(grants))
	for i, g := range grants {
		n, err := m.Native(ctx, g)
		if err != nil {
			return nil, err
		}
		ns[i] = n
	}
	out, err := renewBatch(ctx, ns, req)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if out[i].Err != nil {
			continue
		}
		if out[i].Grant.Token == ns[i].Token {
			out[i].Grant.Token = grants[i].Token
		} else if out[i].Grant.Token, out[i].Err = m.Token(ctx, int64(out[i].Grant.Token)); out[i].Err != nil {
			out[i].Grant = driver.Grant{}
		}
	}
	return out, nil
}

// Info returns info with its native token mapped.
func (m TokenMap) Info(ctx context.Context, info driver.Info) (driver.Info, error) {
	t, err := m.Token(ctx, int64(info.Token))
	info.Token = t
	return info, err
}

// Infos maps the native token of each of infos, in place.
func (m TokenMap) Infos(ctx context.Context, infos []driver.Info) ([]driver.Info, error) {
	for i := range infos {
		var err error
		if infos[i], err = m.Info(ctx, infos[i]); err != nil {
			return nil, err
		}
	}
	return infos, nil
}

// HeldError maps the holder's native token in a *driver.HeldError in err's
// chain and returns err; if the token cannot be mapped, that error
// instead. Any other err is returned as it is.
func (m TokenMap) HeldError(ctx context.Context, err error) error {
	var held *driver.HeldError
	if errors.As(err, &held) && held.Holder.Token != 0 {
		info, terr := m.Info(ctx, held.Holder)
		if terr != nil {
			return terr
		}
		held.Holder = info
	}
	return err
}
