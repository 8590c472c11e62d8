package rdma

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// DecodeControl decodes a channel's control message b (msgpack) into v,
// refusing messages longer than max bytes. Errors wrap bad, the channel's
// sentinel for malformed control messages; what names the message in them
// ("request", "reply").
func DecodeControl(b []byte, max int, v any, bad error, what string) error {
	if len(b) > max {
		return fmt.Errorf("%w: %s of %d bytes", bad, what, len(b))
	}
	if err := msgpack.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %w", bad, what, err)
	}
	return nil
}
