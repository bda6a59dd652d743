package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// errorBody is the admin API's error answer; Field names the offending JSON path for
// validation errors (422).
type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field"`
}

// readBody reads an admin request body of at most rule.MaxConfigSize bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rule.MaxConfigSize))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{Error: fmt.Sprintf("body exceeds %d bytes", rule.MaxConfigSize)})
			return nil, false
		}
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "reading body: " + err.Error()})
		return nil, false
	}
	return b, true
}

// RuleSetJSON turns a rule-set document as an operator writes it into the JSON that
// rule.Parse reads: JSON as is, YAML (a content type or file name saying yaml, or a
// document that does not start with "{") converted with sigs.k8s.io/yaml. A document
// that starts with "{" is JSON even when broken, so the parser's error names the byte
// where it breaks instead of a YAML reader's complaint. The admin API and the
// `rules validate` command share it, so both accept the same documents.
func RuleSetJSON(body []byte, yamlHint bool) ([]byte, error) {
	if !yamlHint && (json.Valid(body) || bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{"))) {
		return body, nil
	}
	j, err := yaml.YAMLToJSON(body)
	if err != nil {
		return nil, fmt.Errorf("neither JSON nor YAML: %w", err)
	}
	return j, nil
}

// toJSON is RuleSetJSON for an admin request's body.
func toJSON(body []byte, contentType string) ([]byte, error) {
	return RuleSetJSON(body, strings.Contains(contentType, "yaml"))
}

// fieldProblem is one error of an invalid rule set.
type fieldProblem struct {
	Field string `json:"field"`
	Error string `json:"error"`
}

// invalidBody is the 422 answer to a rule set the parser refuses: Error and Field are
// those of the first problem (what older clients read), Errors lists every one.
type invalidBody struct {
	Error  string         `json:"error"`
	Field  string         `json:"field"`
	Errors []fieldProblem `json:"errors"`
}

// refuseInvalid answers 422 when err says a rule set was refused (rulestore.ErrInvalid),
// naming every field; it reports whether it answered. The rules store refuses what
// rule.Parse refuses, so the version that was current keeps serving.
func (s *Service) refuseInvalid(w http.ResponseWriter, err error) bool {
	if !errors.Is(err, rulestore.ErrInvalid) {
		return false
	}
	s.m.error("rules_invalid")
	all := rule.All(err)
	var es *rule.Errors
	body := invalidBody{Error: err.Error()}
	if errors.As(err, &es) {
		body.Error = es.Error()
	}
	for _, fe := range all {
		body.Errors = append(body.Errors, fieldProblem{Field: fe.Field, Error: fe.Error()})
	}
	if len(all) > 0 {
		body.Field = all[0].Field
	}
	writeJSON(w, http.StatusUnprocessableEntity, body)
	return true
}

// handleGetRules answers the rule set this instance enforces: after a wipe of Redis
// that is the version it keeps enforcing (and writes back), not Redis's empty one.
func (s *Service) handleGetRules(w http.ResponseWriter, r *http.Request) {
	set, err := s.watcher.Current(r.Context())
	if err != nil {
		s.redisError(w, err)
		return
	}
	w.Header().Set(RulesVersionHeader, strconv.FormatUint(set.Version, 10))
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(set.Body)
}

func (s *Service) handlePutRules(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	js, err := toJSON(body, r.Header.Get("Content-Type"))
	if err != nil {
		s.m.error("rules_invalid")
		writeJSON(w, http.StatusUnprocessableEntity, errorBody{Error: err.Error()})
		return
	}
	v, err := s.updateRules(r.Context(), rulestore.Record{By: actor(r), Action: "put", Reason: reason(r)}, func(*rulestore.Set) ([]byte, error) { return js, nil })
	if s.refuseInvalid(w, err) {
		return
	}
	if err != nil {
		s.storeError(w, err)
		return
	}
	s.observe(r.Context(), v)
	s.audit(r, "rules.put", "version", v, "bytes", len(js))
	w.Header().Set(RulesVersionHeader, strconv.FormatUint(v, 10))
	writeJSON(w, http.StatusOK, map[string]uint64{"version": v})
}

func (s *Service) handleVersions(w http.ResponseWriter, r *http.Request) {
	cur, recs, err := s.ruleVersions(r.Context())
	if err != nil {
		s.storeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"current": cur, "versions": recs})
}

func (s *Service) handleRollback(w http.ResponseWriter, r *http.Request) {
	from, err := strconv.ParseUint(r.PathValue("version"), 10, 64)
	if err != nil || from == 0 {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: fmt.Sprintf("version %q is not a positive integer", r.PathValue("version")), Field: "version"})
		return
	}
	old, err := s.ruleVersion(r.Context(), from)
	if errors.Is(err, rulestore.ErrNotFound) {
		writeJSON(w, http.StatusNotFound, errorBody{Error: err.Error(), Field: "version"})
		return
	}
	if err != nil {
		s.storeError(w, err)
		return
	}
	v, err := s.updateRules(r.Context(), rulestore.Record{By: actor(r), Action: "rollback", From: from, Reason: reason(r)}, func(*rulestore.Set) ([]byte, error) { return old.Body, nil })
	if s.refuseInvalid(w, err) {
		return
	}
	if err != nil {
		s.storeError(w, err)
		return
	}
	s.observe(r.Context(), v)
	s.audit(r, "rules.rollback", "version", v, "from", from)
	w.Header().Set(RulesVersionHeader, strconv.FormatUint(v, 10))
	writeJSON(w, http.StatusOK, map[string]uint64{"version": v, "from": from})
}

// listName validates the {list} path segment.
func listName(w http.ResponseWriter, r *http.Request) (string, bool) {
	l := r.PathValue("list")
	if l != "allow" && l != "deny" {
		writeJSON(w, http.StatusNotFound, errorBody{Error: fmt.Sprintf("no list %q (allow, deny)", l), Field: "list"})
		return "", false
	}
	return l, true
}

// listOf extracts a list from a rule-set body.
func listOf(body []byte, list string) (map[string]json.RawMessage, []string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, nil, fmt.Errorf("stored rule set is not a JSON object: %w", err)
	}
	var entries []string
	if raw, ok := m[list]; ok {
		if err := json.Unmarshal(raw, &entries); err != nil {
			return nil, nil, fmt.Errorf("stored %s list is not a list of strings: %w", list, err)
		}
	}
	return m, entries, nil
}

func (s *Service) handleGetList(w http.ResponseWriter, r *http.Request) {
	list, ok := listName(w, r)
	if !ok {
		return
	}
	set, err := s.watcher.Current(r.Context())
	if err != nil {
		s.redisError(w, err)
		return
	}
	_, entries, err := listOf(set.Body, list)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
		return
	}
	if entries == nil {
		entries = []string{}
	}
	w.Header().Set(RulesVersionHeader, strconv.FormatUint(set.Version, 10))
	writeJSON(w, http.StatusOK, map[string]any{"version": set.Version, "entries": entries})
}

// handleEditList adds (PUT) or removes (DELETE) entries of a list. The body is
// {"entries": [...]} or a bare JSON array; PUT with ?replace=true replaces the list.
// The change becomes a new rule-set version, so gateways fetch it with the rules.
func (s *Service) handleEditList(add bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		list, ok := listName(w, r)
		if !ok {
			return
		}
		body, ok := readBody(w, r)
		if !ok {
			return
		}
		var req struct {
			Entries []string `json:"entries"`
		}
		if err := json.Unmarshal(body, &req.Entries); err != nil {
			if err := json.Unmarshal(body, &req); err != nil {
				writeJSON(w, http.StatusBadRequest, errorBody{Error: `body must be {"entries": ["..."]} or a JSON array of strings`, Field: "entries"})
				return
			}
		}
		replace := add && r.URL.Query().Get("replace") == "true"
		var changed int
		v, err := s.updateRules(r.Context(), rulestore.Record{By: actor(r), Action: list, Reason: reason(r)}, func(cur *rulestore.Set) ([]byte, error) {
			m, entries, err := listOf(cur.Body, list)
			if err != nil {
				return nil, err
			}
			before := len(entries)
			switch {
			case replace:
				entries = slices.Clone(req.Entries)
				changed = len(entries)
			case add:
				for _, e := range req.Entries {
					if !slices.Contains(entries, e) {
						entries = append(entries, e)
					}
				}
				changed = len(entries) - before
			default:
				entries = slices.DeleteFunc(entries, func(e string) bool { return slices.Contains(req.Entries, e) })
				changed = before - len(entries)
			}
			raw, err := json.Marshal(entries)
			if err != nil {
				return nil, err
			}
			m[list] = raw
			return json.Marshal(m)
		})
		if s.refuseInvalid(w, err) {
			return
		}
		if err != nil {
			s.storeError(w, err)
			return
		}
		s.observe(r.Context(), v)
		verb := "add"
		if !add {
			verb = "remove"
		} else if replace {
			verb = "replace"
		}
		s.audit(r, "lists."+verb, "list", list, "entries", len(req.Entries), "changed", changed, "version", v)
		w.Header().Set(RulesVersionHeader, strconv.FormatUint(v, 10))
		writeJSON(w, http.StatusOK, map[string]any{"version": v, "changed": changed})
	}
}

func (s *Service) handleUsage(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "empty key", Field: "key"})
		return
	}
	var u *store.Usage
	var err error
	if cfg := s.ruleSet(r.Context()); cfg != nil {
		u, err = s.st.UsageOf(r.Context(), s.storeKey(r.Context(), key), bucketRefs(cfg, key))
	} else {
		u, err = s.st.Usage(r.Context(), s.storeKey(r.Context(), key))
	}
	if err != nil {
		s.redisError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, u)
}

func (s *Service) handleReset(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "empty key", Field: "key"})
		return
	}
	var n int64
	var err error
	if cfg := s.ruleSet(r.Context()); cfg != nil {
		n, err = s.st.ResetOf(r.Context(), s.storeKey(r.Context(), key), bucketRefs(cfg, key))
	} else {
		n, err = s.st.Reset(r.Context(), s.storeKey(r.Context(), key))
	}
	if err != nil {
		s.redisError(w, err)
		return
	}
	s.audit(r, "reset", "key_hash", s.logKey(key), "deleted", n)
	writeJSON(w, http.StatusOK, map[string]any{"key": key, "deleted": n})
}
