// Package postgres keeps every rule-set version in PostgreSQL: the document, its author,
// time, action and reason. With it (tollgate-ratelimit --policy-store) PostgreSQL is the
// source of truth for rules and Redis a copy the service serves from: a change is
// committed here first (and refused, 503, when PostgreSQL cannot be reached), then
// installed into Redis; the newest version is the active one (versions only grow, a
// rollback is a new version), so the service can put it back into Redis after Redis lost
// its data. Every committed version is announced with NOTIFY on Channel, in the same
// transaction, so every replica learns it even from another Redis.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// Channel is the NOTIFY channel; the payload is the new version.
const Channel = "tollgate_rules"

// ErrUnavailable wraps every failure to reach or use PostgreSQL: rule changes are
// refused while it lasts, serving goes on from Redis.
var ErrUnavailable = errors.New("policy store (PostgreSQL) unavailable: rule changes are refused until it is back; rules keep being served from Redis")

const schema = `
CREATE TABLE IF NOT EXISTS tollgate_rule_versions (
	version      bigint PRIMARY KEY,
	body         bytea NOT NULL,
	author       text NOT NULL,
	action       text NOT NULL,
	from_version bigint NOT NULL DEFAULT 0,
	reason       text NOT NULL DEFAULT '',
	at           timestamptz NOT NULL
)`

// lockKey serialises writers (pg_advisory_xact_lock): the compare-and-set on the newest
// version is one transaction at a time.
const lockKey = 0x746f6c6c67617465 // "tollgate"

// Store is the policy store.
type Store struct {
	pool  *pgxpool.Pool
	ready atomic.Bool // the table exists
}

// Open prepares connections to url (a postgres:// URL or key=value DSN; a password is
// best kept out of it, in PGPASSFILE or PGPASSWORD, which pgx reads). It fails only for
// a malformed url: PostgreSQL may be down at start, like later (Ping says whether it
// answers); the table is created at first use.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("policy store: %w", err)
	}
	cfg.MaxConns = 4
	// Rule changes are rare: check every connection before use, so the first change
	// after PostgreSQL restarted does not fail on a connection it closed.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("policy store: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Ping creates the table if needed, and so says whether PostgreSQL answers.
func (s *Store) Ping(ctx context.Context) error { return s.ensure(ctx) }

func (s *Store) ensure(ctx context.Context) error {
	if s.ready.Load() {
		return nil
	}
	// CREATE TABLE IF NOT EXISTS is not safe against itself: two sessions creating the
	// table at once (replicas starting together, or the restore loop and a rule change
	// in one service) can fail on pg_type's unique index. The writers' lock serialises it.
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(lockKey)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return unavailable(err)
	}
	s.ready.Store(true)
	return nil
}

// Close closes the connections.
func (s *Store) Close() { s.pool.Close() }

func unavailable(err error) error { return fmt.Errorf("%w: %w", ErrUnavailable, err) }

// Active returns the newest version (rulestore.EmptyBody as version 0 before any) and
// its record.
func (s *Store) Active(ctx context.Context) (*rulestore.Set, rulestore.Record, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, rulestore.Record{}, err
	}
	row := s.pool.QueryRow(ctx, `SELECT version, body, author, action, from_version, reason, at
		FROM tollgate_rule_versions ORDER BY version DESC LIMIT 1`)
	set, rec, err := scan(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return &rulestore.Set{Body: []byte(rulestore.EmptyBody)}, rulestore.Record{}, nil
	}
	if err != nil {
		return nil, rulestore.Record{}, unavailable(err)
	}
	return set, rec, nil
}

// ActiveVersion returns the newest version (0: none).
func (s *Store) ActiveVersion(ctx context.Context) (uint64, error) {
	if err := s.ensure(ctx); err != nil {
		return 0, err
	}
	var v int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM tollgate_rule_versions`).Scan(&v); err != nil {
		return 0, unavailable(err)
	}
	return uint64(v), nil
}

// Get returns version v (rulestore.ErrNotFound when there is none).
func (s *Store) Get(ctx context.Context, v uint64) (*rulestore.Set, rulestore.Record, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, rulestore.Record{}, err
	}
	row := s.pool.QueryRow(ctx, `SELECT version, body, author, action, from_version, reason, at
		FROM tollgate_rule_versions WHERE version = $1`, int64(v))
	set, rec, err := scan(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, rulestore.Record{}, fmt.Errorf("%w: version %d", rulestore.ErrNotFound, v)
	}
	if err != nil {
		return nil, rulestore.Record{}, unavailable(err)
	}
	return set, rec, nil
}

func scan(row pgx.Row) (*rulestore.Set, rulestore.Record, error) {
	var (
		v, from int64
		body    []byte
		rec     rulestore.Record
	)
	if err := row.Scan(&v, &body, &rec.By, &rec.Action, &from, &rec.Reason, &rec.At); err != nil {
		return nil, rulestore.Record{}, err
	}
	rec.Version, rec.From, rec.Size, rec.At = uint64(v), uint64(from), len(body), rec.At.UTC()
	return &rulestore.Set{Version: uint64(v), Body: body}, rec, nil
}

// Versions returns the newest limit version records, newest first.
func (s *Store) Versions(ctx context.Context, limit int) ([]rulestore.Record, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT version, octet_length(body), author, action, from_version, reason, at
		FROM tollgate_rule_versions ORDER BY version DESC LIMIT $1`, limit)
	if err != nil {
		return nil, unavailable(err)
	}
	defer rows.Close()
	var out []rulestore.Record
	for rows.Next() {
		var v, from int64
		var rec rulestore.Record
		if err := rows.Scan(&v, &rec.Size, &rec.By, &rec.Action, &from, &rec.Reason, &rec.At); err != nil {
			return nil, unavailable(err)
		}
		rec.Version, rec.From, rec.At = uint64(v), uint64(from), rec.At.UTC()
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable(err)
	}
	return out, nil
}

// Put commits body as the version after base (rulestore.NextVersion) if base is still
// the newest, and announces it, in one transaction. It returns the stored set (its
// body's "version" set), rulestore.ErrConflict when another writer got there first, an
// error wrapping rulestore.ErrInvalid when body is not a rule set, and one wrapping
// ErrUnavailable when PostgreSQL fails.
func (s *Store) Put(ctx context.Context, base uint64, body []byte, rec rulestore.Record) (*rulestore.Set, error) {
	if _, err := rule.Parse(body); err != nil {
		return nil, fmt.Errorf("%w: %w", rulestore.ErrInvalid, err)
	}
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(lockKey)); err != nil {
		return nil, unavailable(err)
	}
	var cur int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM tollgate_rule_versions`).Scan(&cur); err != nil {
		return nil, unavailable(err)
	}
	if uint64(cur) != base {
		return nil, fmt.Errorf("%w: base %d, current %d", rulestore.ErrConflict, base, cur)
	}
	v := rulestore.NextVersion(base, time.Now())
	body, err = rulestore.WithVersion(body, v)
	if err != nil {
		return nil, err
	}
	if rec.At.IsZero() {
		rec.At = time.Now().UTC()
	}
	if _, err := tx.Exec(ctx, `INSERT INTO tollgate_rule_versions (version, body, author, action, from_version, reason, at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, int64(v), body, rec.By, rec.Action, int64(rec.From), rec.Reason, rec.At); err != nil {
		return nil, unavailable(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, Channel, strconv.FormatUint(v, 10)); err != nil {
		return nil, unavailable(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, unavailable(err)
	}
	return &rulestore.Set{Version: v, Body: body}, nil
}

// Listen calls fn with each announced version until ctx ends, reconnecting after a
// failure; fn(0) is called after every (re)connection, since announcements made while
// disconnected are lost (the caller then reads the active version).
func (s *Store) Listen(ctx context.Context, fn func(v uint64)) {
	for ctx.Err() == nil {
		s.listenOnce(ctx, fn)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Store) listenOnce(ctx context.Context, fn func(v uint64)) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return
	}
	// A listening connection is not returned to the pool with LISTEN still on.
	defer conn.Release()
	defer func() { _ = conn.Conn().Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return
	}
	fn(0)
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return
		}
		if v, err := strconv.ParseUint(n.Payload, 10, 64); err == nil {
			fn(v)
		}
	}
}
