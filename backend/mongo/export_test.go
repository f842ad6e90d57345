package mongo

import (
	"context"
	"time"
)

// EndAsIfReadAt runs the takeover's end step as a contender that read
// key's record at epoch n, judged it expired, and was paused until now.
func (b *Backend) EndAsIfReadAt(ctx context.Context, key string, n int64) error {
	st, err := b.readKey(ctx, key)
	if err != nil {
		return err
	}
	st.n = n
	st.exp = date(time.Unix(0, 0))
	return b.end(ctx, key, &st, "paused-contender", false, b.clock.now(ctx))
}

// ClaimEndOnly inserts the end claim of key's record's next epoch and
// stops there, as an ender whose context ended (or whose server died)
// right after its claim.
func (b *Backend) ClaimEndOnly(ctx context.Context, key string) error {
	st, err := b.readKey(ctx, key)
	if err != nil {
		return err
	}
	_, err = b.locks.InsertOne(ctx, b.epochClaim(st.rid, key, kindEnd, "stopped-ender", st.n+1, b.clock.now(ctx)))
	return err
}
