package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// client calls the admin API.
type client struct {
	base, token, actor string
	reason             string
	timeout            time.Duration
	http               http.Client
}

// maxReply bounds what is read of one answer (a rule set is at most 1 MiB; usage of a
// key with many buckets is larger than that only in a broken service).
const maxReply = 8 << 20

// apiError is the admin API's error body.
type apiError struct {
	Error  string `json:"error"`
	Field  string `json:"field"`
	Errors []struct {
		Field string `json:"field"`
		Error string `json:"error"`
	} `json:"errors"`
}

// do sends one request and decodes a 2xx JSON answer into out (when not nil); any other
// outcome is an error an operator can act on.
func (c *client) do(ctx context.Context, method, path, contentType string, body []byte, out any) (http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("--server %q: %w", c.base, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.actor != "" {
		req.Header.Set("X-Tollgate-Actor", c.actor)
	}
	if c.reason != "" {
		req.Header.Set("X-Tollgate-Reason", c.reason)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the service at %s: %w", c.base, unwrapURL(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		if out != nil {
			if err := json.Unmarshal(raw, out); err != nil {
				return nil, fmt.Errorf("%s %s: the answer is not what this tollgate expects (%v): is --server the admin listener?", method, path, err)
			}
		}
		return resp.Header, nil
	}
	var e apiError
	_ = json.Unmarshal(raw, &e)
	msg := e.Error
	if msg == "" {
		msg = strings.TrimSpace(string(raw))
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		if c.token == "" {
			return nil, errors.New("401 Unauthorized: no admin token: set TOLLGATE_ADMIN_TOKEN or --admin-token-file")
		}
		return nil, errors.New("401 Unauthorized: the service refused the admin token (TOLLGATE_ADMIN_TOKEN or --admin-token-file)")
	case http.StatusUnprocessableEntity:
		var lines []string
		for _, fe := range e.Errors {
			lines = append(lines, fmt.Sprintf("%s: %s", fe.Field, strings.TrimPrefix(fe.Error, fe.Field+": ")))
		}
		if len(lines) == 0 {
			line := msg
			if e.Field != "" && !strings.HasPrefix(msg, e.Field) {
				line = e.Field + ": " + msg
			}
			lines = append(lines, line)
		}
		return nil, fmt.Errorf("422 the service refused the rule set:\n%s", strings.Join(lines, "\n"))
	}
	if e.Field != "" {
		return nil, fmt.Errorf("%s: %s (field %s)", resp.Status, msg, e.Field)
	}
	return nil, fmt.Errorf("%s: %s", resp.Status, msg)
}

// unwrapURL drops url.Error's "Get \"...\":" prefix (the base URL is already named).
func unwrapURL(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}
