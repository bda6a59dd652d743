package postgres

import "context"

// Truncate empties the store (tests share one server).
func Truncate(ctx context.Context, s *Store) error {
	_, err := s.pool.Exec(ctx, "TRUNCATE tollgate_rule_versions")
	return err
}

// Drop removes the table, as on a database the service has never used.
func Drop(ctx context.Context, s *Store) error {
	_, err := s.pool.Exec(ctx, "DROP TABLE IF EXISTS tollgate_rule_versions")
	return err
}
