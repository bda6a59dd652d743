package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestLaunchDownStart: the server accepts connections to its database, refuses them while
// down, and keeps its data across a restart.
func TestLaunchDownStart(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	s.Down()
	if err := exec("SELECT 1"); err == nil {
		t.Fatal("connected while the server is down")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT n FROM kept").Scan(&n); err != nil || n != 7 {
		t.Fatalf("after restart: n = %d, %v; want 7", n, err)
	}
}
