package harness

import (
	"fmt"
	"time"
)

// Poll calls cond every interval until it reports true, returns an error, or timeout
// passes. It is how scenarios wait for something to happen without sleeping a guessed
// duration; the timeout is a bound, never the measurement.
func Poll(timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("not within %v (last error: %w)", timeout, last)
			}
			return fmt.Errorf("not within %v", timeout)
		}
		time.Sleep(interval)
	}
}
