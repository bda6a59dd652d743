package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/ratelimit/top"
)

// httpClient is for control-plane calls (admin API, metrics): short timeouts, so a dead
// endpoint fails a poll instead of hanging it.
var httpClient = &http.Client{Timeout: 5 * time.Second}

// Admin calls the service's admin API.
type Admin struct {
	Base  string // e.g. Service.URL()
	Token string
	// Actor and Reason are sent with changes (X-Tollgate-Actor, default "e2e";
	// X-Tollgate-Reason).
	Actor, Reason string
}

func (a Admin) do(method, path string, body []byte, contentType string) ([]byte, http.Header, error) {
	req, err := http.NewRequest(method, a.Base+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+a.Token)
	actor := a.Actor
	if actor == "" {
		actor = "e2e"
	}
	req.Header.Set("X-Tollgate-Actor", actor)
	if a.Reason != "" {
		req.Header.Set("X-Tollgate-Reason", a.Reason)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return b, resp.Header, fmt.Errorf("%s %s: %w: %s", method, path, ErrNotFound, tail(b, 500))
	case resp.StatusCode/100 != 2:
		return b, resp.Header, fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, tail(b, 500))
	}
	return b, resp.Header, nil
}

// PutRules replaces the rule set (a JSON document, shared/rule/SCHEMA.md) and returns
// its new version.
func (a Admin) PutRules(doc []byte) (uint64, error) {
	b, _, err := a.do(http.MethodPut, "/v1/rules", doc, "application/json")
	if err != nil {
		return 0, err
	}
	var out struct {
		Version uint64 `json:"version"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return 0, fmt.Errorf("PUT /v1/rules: answer %q: %w", tail(b, 200), err)
	}
	return out.Version, nil
}

// RulesVersion is the current rule-set version (0 when none was ever stored).
func (a Admin) RulesVersion() (uint64, error) {
	_, h, err := a.do(http.MethodGet, "/v1/rules", nil, "")
	if err != nil {
		if h != nil && h.Get("X-Tollgate-Rules-Version") == "" {
			return 0, nil
		}
		return 0, err
	}
	v := h.Get("X-Tollgate-Rules-Version")
	if v == "" {
		return 0, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

// Usage reads every bucket of a caller key (GET /v1/usage/{key}).
func (a Admin) Usage(key string) (*store.Usage, error) {
	b, _, err := a.do(http.MethodGet, "/v1/usage/"+url.PathEscape(key), nil, "")
	if err != nil {
		return nil, err
	}
	var u store.Usage
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, fmt.Errorf("usage of %q: %w", key, err)
	}
	return &u, nil
}

// Bucket returns the usage of one rule's window for key, or nil when Redis has none.
func (a Admin) Bucket(key, rule string, window int) (*store.BucketUsage, int64, error) {
	u, err := a.Usage(key)
	if err != nil {
		return nil, 0, err
	}
	for i := range u.Buckets {
		if b := &u.Buckets[i]; b.Rule == rule && b.Window == window {
			return b, u.NowUs, nil
		}
	}
	return nil, u.NowUs, nil
}

// Top returns GET /v1/top for rule: its keys with the most refusals.
func (a Admin) Top(rule string) (*top.List, error) {
	b, _, err := a.do(http.MethodGet, "/v1/top?rule="+url.QueryEscape(rule), nil, "")
	if err != nil {
		return nil, err
	}
	var l top.List
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("top of %q: %w", rule, err)
	}
	return &l, nil
}
