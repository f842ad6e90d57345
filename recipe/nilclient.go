package recipe

import "github.com/fencelock/fencelock"

// needClient refuses a nil Client at a recipe's entry, where the mistake is
// made, rather than with a nil pointer panic at its first use.
func needClient(c *fencelock.Client) error {
	if c == nil {
		return &fencelock.InvalidOptionError{Option: "Client", Value: "nil",
			Reason: "a recipe needs an open *fencelock.Client: create one with fencelock.Open or fencelock.New"}
	}
	return nil
}
