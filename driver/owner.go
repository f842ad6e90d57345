package driver

import "strings"

// ownerNonceLen is the length of the hex nonce in the suffix the engine
// appends to an owner label; see OwnerLabel.
const ownerNonceLen = 12

// OwnerLabel returns the owner label inside an owner string that the
// engine built: the engine records label + "/" + a 12-hex-digit client
// nonce + "." + a decimal call number, so that owners are unique per call
// while the label stays what the user gave (fencelock.WithLabel,
// Options.Owner). An owner without that suffix (written by another tool)
// is returned whole; "" for a free key.
func OwnerLabel(owner string) string {
	i := strings.LastIndexByte(owner, '/')
	if i < 0 {
		return owner
	}
	suffix := owner[i+1:]
	dot := strings.IndexByte(suffix, '.')
	if dot != ownerNonceLen || dot == len(suffix)-1 {
		return owner
	}
	for j := 0; j < len(suffix); j++ {
		c := suffix[j]
		switch {
		case j < dot && (c >= '0' && c <= '9' || c >= 'a' && c <= 'f'):
		case j > dot && c >= '0' && c <= '9':
		case j == dot:
		default:
			return owner
		}
	}
	return owner[:i]
}

// Label returns the holder's owner label (OwnerLabel of Owner): the
// identity the holder gave, without the per-call suffix that keeps owner
// strings unique. "" if the key is free.
func (i Info) Label() string { return OwnerLabel(i.Owner) }
