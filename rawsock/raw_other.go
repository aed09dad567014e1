//go:build !linux

package rawsock

import "errors"

// supported is false: Wrap returns connections as they are.
const supported = false

// Recv is never called where there is no raw read.
func Recv(uintptr, []byte) (int, error) { return 0, errors.ErrUnsupported }

func send(uintptr, []byte) (int, error) { return 0, errors.ErrUnsupported }

// Peek is never called where there is no raw read.
func Peek(uintptr, *[1]byte) (int, error) { return 0, errors.ErrUnsupported }
