package perf

import (
	"fmt"
	"time"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// nativeRun returns a function that sends n of m's requests through the plugin's own
// code run natively (nativeHost).
func nativeRun(c *Cost, m CostModule) (func(n int) error, error) {
	h, headers, err := nativeHost(m)
	if err != nil {
		return nil, err
	}
	return func(n int) error {
		for k := 0; k < n; k++ {
			s := h.Request(0, headers, nil)
			if st := s.Status(); st != 200 || !s.Ended {
				c.Status = int(st)
				return fmt.Errorf("status %d (ended %v)", st, s.Ended)
			}
		}
		c.Status = 200
		return nil
	}, nil
}

// nativeHost starts m's configuration on one native worker (filter/nativehost) and
// returns it with the request header map internal/wazerohost hands a module for m's
// request; the upstream answers with the header map internal/wazerohost gives a module
// for m's response, so that the native row runs the module's decision.
func nativeHost(m CostModule) (*nativehost.Host, [][2]string, error) {
	req, up := m.exchange()
	upstream := nativehost.Upstream{Headers: wazerohost.ResponseHeaderPairs(up)}
	h, err := nativehost.New(nativehost.Config{
		PluginConfig: m.Config,
		Clock:        func() int64 { return time.Now().UnixMicro() },
		Upstream:     func([][2]string) nativehost.Upstream { return upstream },
	})
	if err != nil {
		return nil, nil, err
	}
	return h, wazerohost.RequestPairs(req), nil
}
