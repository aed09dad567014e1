//go:build !linux

package rawsock

import (
	"errors"
	"time"
)

// Poller is Linux's only: NewPoller fails elsewhere, and waits block their
// goroutine.
type Poller struct{}

// Waiter is a wait parked on a Poller.
type Waiter interface {
	Due() bool
	Wake(due bool)
}

// NewPoller returns errors.ErrUnsupported.
func NewPoller(time.Duration) (*Poller, error) { return nil, errors.ErrUnsupported }

// Register is never called where NewPoller fails.
func (p *Poller) Register(int) (int32, error) { return -1, errors.ErrUnsupported }

// Forget is never called where NewPoller fails.
func (p *Poller) Forget(int32) {}

// Unregister is never called where NewPoller fails.
func (p *Poller) Unregister(int32, int) {}

// Park is never called where NewPoller fails.
func (p *Poller) Park(int32, Waiter, time.Time, bool) (bool, error) {
	return false, errors.ErrUnsupported
}

// Parked returns 0.
func (p *Poller) Parked() int { return 0 }
