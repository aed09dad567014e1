package pinstore

import (
	"context"
	"testing"
	"time"
)

func TestReadCtx(t *testing.T) {
	// Not waited on: no channel, and Err follows the clock.
	c := newReadCtx(time.Hour)
	if dl, ok := c.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
		t.Errorf("deadline %v %v", dl, ok)
	}
	if c.Err() != nil {
		t.Error("Err before the deadline")
	}
	c.release()

	// Waited on: Done closes at the deadline.
	c = newReadCtx(5 * time.Millisecond)
	t0 := time.Now()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed at the deadline")
	}
	if d := time.Since(t0); d < 4*time.Millisecond {
		t.Errorf("Done closed after %v, before the deadline", d)
	}
	if c.Err() != context.DeadlineExceeded {
		t.Errorf("Err %v after Done", c.Err())
	}
	c.release()

	// Reused with a long deadline: the earlier use's timer does not close
	// the new Done; release does, for a late waiter.
	for range 100 {
		c = newReadCtx(time.Hour)
		ch := c.Done()
		select {
		case <-ch:
			t.Fatal("a new use's Done is closed")
		default:
		}
		if c.Err() != nil {
			t.Fatal("Err of a new use")
		}
		c.release()
		select {
		case <-ch:
		default:
			t.Fatal("release did not close Done")
		}
	}

	// Past the deadline at once.
	c = newReadCtx(-time.Second)
	if c.Err() != context.DeadlineExceeded {
		t.Error("Err past the deadline")
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done of a passed deadline is open")
	}
	c.release()
}
