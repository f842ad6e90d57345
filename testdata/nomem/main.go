// Command nomem opens mem:// without importing backend/memory, for
// TestOpenMemWithoutTheImportSaysWhichToAdd: it prints whether the error
// is fencelock.ErrUnknownScheme, then the error.
package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
)

func main() {
	_, err := fencelock.Open(context.Background(), "mem://x", nil)
	fmt.Printf("errors.Is ErrUnknownScheme: %v; %v\n", errors.Is(err, fencelock.ErrUnknownScheme), err)
}
