// Package pgstore is the statestore.Store on Postgres, shared by every node of a cluster.
//
// Fencing rests on one row per instance in pinned_instance_fence. Every Fence, Load and Commit
// starts with an upsert of that row that keeps the greater generation and returns it; the upsert
// takes the row lock, so writers of one instance (on any node) queue behind each other for the
// rest of their transaction, and a writer whose generation is older sees the newer one and rolls
// back. The same row carries the instance's sequence counter, so seqs are reserved under that
// lock and outlive the trays they were handed to.
//
// CollectFences drops the rows of instances that hold no tray, never reserved a seq, are not
// live and are below the floor, which it raises in the same transaction (pinned_fence_floor).
// An upsert that finds no row and inserts one (a first activation, or one after collection)
// then reads the floor in a statement of its own: one begun after the upsert, so it sees every
// collection that dropped a row the upsert could have found, and the floor that collection set.
// A generation below it is fenced and the insert rolled back.
//
// A Commit is one READ COMMITTED transaction of three round trips: the fence upsert, one pipelined
// batch with every mutation and the re-derived index rows of the trays it touched, and COMMIT.
//
// Setup migrates under pg_advisory_xact_lock, so nodes starting together migrate exactly once.
// The package must never hold the fence row lock across anything but its own statements.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pinnedd/pinnedd/statestore"
)

// DefaultMaxConns sizes the pool when the DSN has no pool_max_conns. Commits are short and
// mostly wait on the server's WAL flush, so a handful of connections per node keeps the node busy
// without eating into the server's max_connections (100 by default) when many nodes share it.
const DefaultMaxConns = 8

// IdleInTransactionTimeout bounds how long the server lets one of the store's transactions sit
// idle (idle_in_transaction_session_timeout, set for each transaction). A node cut off between
// its fence upsert and COMMIT (a partition, a frozen process) leaves its transaction open on the
// server, holding the fence row lock: without a bound, the next owner's Load waits on that lock
// until the server notices the dead connection (TCP keepalive: two hours by default), and the
// instance cannot activate anywhere. The store's transactions are a few pipelined round trips,
// never idle for long; the server ends one that idles this long, and the lock goes with it.
const IdleInTransactionTimeout = "5s"

// beginTx begins every transaction of the store. SET LOCAL rides in BEGIN's round trip, and
// works through connection poolers (PgBouncer refuses unknown startup parameters).
var beginTx = pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '" + IdleInTransactionTimeout + "'"}

// Store is a statestore.Store on a pgxpool.
type Store struct {
	pool   *pgxpool.Pool
	closed atomic.Bool
}

var _ statestore.Store = (*Store)(nil)

// Open connects a pool to dsn and checks that the server answers. It does not create tables:
// call Setup.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgstore: open: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pinnedd"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: open: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: open: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Pool exposes the pool, for tests and operational queries of the same database.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Begin starts a transaction as the store's own start (with IdleInTransactionTimeout), for
// tests and operational scripts that must not hold the fence row lock past it either.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.pool.BeginTx(ctx, beginTx) }

func (s *Store) usable(ctx context.Context) error {
	if s.closed.Load() {
		return statestore.ErrClosed
	}
	return ctx.Err()
}

// wrap prefixes err with the operation, and marks it ErrClosed when the pool was closed under
// the call.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if s.closed.Load() && !errors.Is(err, statestore.ErrClosed) {
		return fmt.Errorf("pgstore: %s: %w: %w", op, statestore.ErrClosed, err)
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}

// Setup creates or migrates the tables. The advisory lock is held until the transaction ends,
// so concurrent callers run one after the other and all but the first find nothing to do.
func (s *Store) Setup(ctx context.Context) error {
	if err := s.usable(ctx); err != nil {
		return s.wrap("setup", err)
	}
	return s.wrap("setup", pgx.BeginTxFunc(ctx, s.pool, beginTx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", setupLockKey); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, createVersionTable); err != nil {
			return err
		}
		var version int
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM pinned_schema_version").Scan(&version); err != nil {
			return err
		}
		if version > len(migrations) {
			return fmt.Errorf("database has schema version %d, this build knows up to %d", version, len(migrations))
		}
		for v := version; v < len(migrations); v++ {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return fmt.Errorf("migration %d: %w", v+1, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO pinned_schema_version (version) VALUES ($1)", v+1); err != nil {
				return err
			}
		}
		return nil
	}))
}

// fenceSQL raises the fence to $3 unless it is already newer, and reserves $4 seqs. It returns
// the generation now stored and the last reserved seq. When the returned generation is newer
// than $3 the caller is fenced and rolls back; Fence, which runs it alone, then writes the row
// back unchanged (GREATEST keeps the generation, updated_at moves only when it rises).
//
// inserted (xmax = 0: the row version is this statement's insert, not an update) tells the
// caller to check the floor (see fence).
const fenceSQL = `
INSERT INTO pinned_instance_fence AS f (ns, id, generation, last_seq) VALUES ($1, $2, $3, $4)
ON CONFLICT (ns, id) DO UPDATE SET
	generation = GREATEST(f.generation, EXCLUDED.generation),
	last_seq = f.last_seq + $4,
	updated_at = CASE WHEN EXCLUDED.generation > f.generation THEN now() ELSE f.updated_at END
RETURNING generation, last_seq, xmax = 0`

const floorSQL = `SELECT generation FROM pinned_fence_floor`

// fence runs fenceSQL in tx and returns the first reserved seq. When it inserted the row, the
// instance had no fence (never seen, or collected) and gen must also reach the floor; the
// caller rolls back on any error, so a refused insert leaves nothing.
func fence(ctx context.Context, tx pgx.Tx, inst statestore.InstanceKey, gen uint64, n int) (first int64, err error) {
	var stored, last int64
	var inserted bool
	if err := tx.QueryRow(ctx, fenceSQL, inst.Namespace, inst.ID, int64(gen), int64(n)).Scan(&stored, &last, &inserted); err != nil {
		return 0, err
	}
	if uint64(stored) > gen {
		return 0, statestore.FencedError(inst, gen, uint64(stored))
	}
	if inserted {
		var floor int64
		if err := tx.QueryRow(ctx, floorSQL).Scan(&floor); err != nil {
			return 0, err
		}
		if uint64(floor) > gen {
			return 0, statestore.FencedError(inst, gen, uint64(floor))
		}
	}
	return last - int64(n) + 1, nil
}

// Fence implements statestore.Store: the upsert alone, in a transaction so that an insert the
// floor refuses is rolled back.
func (s *Store) Fence(ctx context.Context, inst statestore.InstanceKey, gen uint64) error {
	if err := statestore.ValidateFence(inst, gen); err != nil {
		return fmt.Errorf("pgstore: fence: %w", err)
	}
	if err := s.usable(ctx); err != nil {
		return s.wrap("fence", err)
	}
	return s.wrap("fence", pgx.BeginTxFunc(ctx, s.pool, beginTx, func(tx pgx.Tx) error {
		_, err := fence(ctx, tx, inst, gen, 0)
		return err
	}))
}

// Load implements statestore.Store. The reads run in the transaction that holds the fence row
// lock, so no commit of this instance lands between fencing and reading.
func (s *Store) Load(ctx context.Context, inst statestore.InstanceKey, gen uint64) ([]statestore.Tray, error) {
	if err := statestore.ValidateFence(inst, gen); err != nil {
		return nil, fmt.Errorf("pgstore: load: %w", err)
	}
	if err := s.usable(ctx); err != nil {
		return nil, s.wrap("load", err)
	}
	var trays []statestore.Tray
	err := pgx.BeginTxFunc(ctx, s.pool, beginTx, func(tx pgx.Tx) error {
		if _, err := fence(ctx, tx, inst, gen, 0); err != nil {
			return err
		}
		trays = nil
		at := map[statestore.TrayKey]int{}
		b := &pgx.Batch{}
		b.Queue(`SELECT tray_ns, tray_id, marked FROM pinned_tray_index WHERE ns = $1 AND id = $2
			ORDER BY tray_ns, tray_id`, inst.Namespace, inst.ID).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				t := statestore.Tray{Fields: map[string][]byte{}}
				if err := rows.Scan(&t.Key.NS, &t.Key.ID, &t.Marked); err != nil {
					return err
				}
				at[t.Key] = len(trays)
				trays = append(trays, t)
			}
			return rows.Err()
		})
		b.Queue(`SELECT tray_ns, tray_id, name, value FROM pinned_tray_fields WHERE ns = $1 AND id = $2`,
			inst.Namespace, inst.ID).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var k statestore.TrayKey
				var name string
				var value []byte
				if err := rows.Scan(&k.NS, &k.ID, &name, &value); err != nil {
					return err
				}
				if i, ok := at[k]; ok {
					if value == nil {
						value = []byte{} // an empty value is a value
					}
					trays[i].Fields[name] = value
				}
			}
			return rows.Err()
		})
		b.Queue(`SELECT tray_ns, tray_id, seq, payload, applied FROM pinned_tray_items WHERE ns = $1 AND id = $2
			ORDER BY tray_ns, tray_id, seq`, inst.Namespace, inst.ID).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var k statestore.TrayKey
				var it statestore.Item
				if err := rows.Scan(&k.NS, &k.ID, &it.Seq, &it.Payload, &it.Applied); err != nil {
					return err
				}
				if i, ok := at[k]; ok {
					trays[i].Items = append(trays[i].Items, it)
				}
			}
			return rows.Err()
		})
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, s.wrap("load", err)
	}
	return trays, nil
}

// SQL of the mutations; $1..$4 are always ns, id, tray_ns, tray_id.
const (
	trayWhere   = `ns = $1 AND id = $2 AND tray_ns = $3 AND tray_id = $4`
	setFieldSQL = `INSERT INTO pinned_tray_fields (ns, id, tray_ns, tray_id, name, value) VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (ns, id, tray_ns, tray_id, name) DO UPDATE SET value = EXCLUDED.value`
	delFieldSQL = `DELETE FROM pinned_tray_fields WHERE ` + trayWhere + ` AND name = $5`
	appendSQL   = `INSERT INTO pinned_tray_items (ns, id, tray_ns, tray_id, seq, payload)
SELECT $1, $2, $3, $4, u.seq, u.payload FROM unnest($5::bigint[], $6::bytea[]) AS u(seq, payload)`
	markSQL      = `UPDATE pinned_tray_items SET applied = true WHERE ` + trayWhere + ` AND seq <= $5 AND NOT applied`
	removeSQL    = `DELETE FROM pinned_tray_items WHERE ` + trayWhere + ` AND seq <= $5`
	delFieldsSQL = `DELETE FROM pinned_tray_fields WHERE ` + trayWhere
	delItemsSQL  = `DELETE FROM pinned_tray_items WHERE ` + trayWhere

	// reindexSQL derives the tray's index row from what the commit left: no row for an empty
	// tray, marked iff it holds an item, and the generation of this write.
	reindexSQL = `
WITH s AS (
	SELECT EXISTS (SELECT 1 FROM pinned_tray_items WHERE ` + trayWhere + `) AS marked,
	       EXISTS (SELECT 1 FROM pinned_tray_fields WHERE ` + trayWhere + `) AS has_fields
), gone AS (
	DELETE FROM pinned_tray_index WHERE ` + trayWhere + ` AND NOT (SELECT marked OR has_fields FROM s)
)
INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, generation, updated_at)
SELECT $1, $2, $3, $4, s.marked, $5, now() FROM s WHERE s.marked OR s.has_fields
ON CONFLICT (ns, id, tray_ns, tray_id) DO UPDATE SET
	marked = EXCLUDED.marked, generation = EXCLUDED.generation, updated_at = EXCLUDED.updated_at`
)

// Commit implements statestore.Store.
func (s *Store) Commit(ctx context.Context, inst statestore.InstanceKey, gen uint64, muts []statestore.Mutation) (statestore.CommitResult, error) {
	appended, err := statestore.ValidateCommit(inst, gen, muts)
	if err != nil {
		return statestore.CommitResult{}, fmt.Errorf("pgstore: commit: %w", err)
	}
	if err := s.usable(ctx); err != nil {
		return statestore.CommitResult{}, s.wrap("commit", err)
	}
	var res statestore.CommitResult
	err = pgx.BeginTxFunc(ctx, s.pool, beginTx, func(tx pgx.Tx) error {
		next, err := fence(ctx, tx, inst, gen, appended)
		if err != nil {
			return err
		}
		if len(muts) == 0 {
			return nil
		}
		res = statestore.CommitResult{}
		b := &pgx.Batch{}
		var touched []statestore.TrayKey
		seen := map[statestore.TrayKey]bool{}
		for _, m := range muts {
			tk := statestore.TrayOf(m)
			if !seen[tk] {
				seen[tk] = true
				touched = append(touched, tk)
			}
			key := []any{inst.Namespace, inst.ID, tk.NS, tk.ID}
			switch m := m.(type) {
			case statestore.SetField:
				if m.Value == nil {
					b.Queue(delFieldSQL, append(key, m.Name)...)
				} else {
					b.Queue(setFieldSQL, append(key, m.Name, m.Value)...)
				}
			case statestore.AppendItems:
				seqs := make([]int64, len(m.Payloads))
				ps := make([][]byte, len(m.Payloads))
				for i, p := range m.Payloads {
					seqs[i] = next
					next++
					if p == nil {
						p = []byte{} // a nil slice would be a NULL element
					}
					ps[i] = p
				}
				res.Seqs = append(res.Seqs, seqs)
				if len(seqs) > 0 {
					b.Queue(appendSQL, append(key, seqs, ps)...)
				}
			case statestore.MarkApplied:
				b.Queue(markSQL, append(key, m.UpTo)...)
			case statestore.RemoveItems:
				b.Queue(removeSQL, append(key, m.UpTo)...)
			case statestore.DeleteTray:
				b.Queue(delFieldsSQL, key...)
				b.Queue(delItemsSQL, key...)
			}
		}
		for _, tk := range touched {
			b.Queue(reindexSQL, inst.Namespace, inst.ID, tk.NS, tk.ID, int64(gen))
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return statestore.CommitResult{}, s.wrap("commit", err)
	}
	return res, nil
}

// ListMarked implements statestore.Store on the partial index of marked trays.
func (s *Store) ListMarked(ctx context.Context, after statestore.InstanceKey, limit int) ([]statestore.InstanceKey, error) {
	if err := statestore.ValidateAfter(after); err != nil {
		return nil, fmt.Errorf("pgstore: list marked: %w", err)
	}
	if err := statestore.ValidateListLimit(limit); err != nil {
		return nil, fmt.Errorf("pgstore: list marked: %w", err)
	}
	if err := s.usable(ctx); err != nil {
		return nil, s.wrap("list marked", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT ns, id FROM pinned_tray_index
		WHERE marked AND (ns, id) > ($1::text COLLATE "C", $2::text COLLATE "C")
		ORDER BY ns, id LIMIT $3`, after.Namespace, after.ID, limit)
	if err != nil {
		return nil, s.wrap("list marked", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (statestore.InstanceKey, error) {
		var k statestore.InstanceKey
		err := r.Scan(&k.Namespace, &k.ID)
		return k, err
	})
	if err != nil {
		return nil, s.wrap("list marked", err)
	}
	return out, nil
}

// Generation implements statestore.Store.
func (s *Store) Generation(ctx context.Context, inst statestore.InstanceKey) (uint64, error) {
	if err := statestore.ValidateInstance(inst); err != nil {
		return 0, fmt.Errorf("pgstore: generation: %w", err)
	}
	if err := s.usable(ctx); err != nil {
		return 0, s.wrap("generation", err)
	}
	var gen int64
	err := s.pool.QueryRow(ctx, `SELECT generation FROM pinned_instance_fence WHERE ns = $1 AND id = $2`,
		inst.Namespace, inst.ID).Scan(&gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, s.wrap("generation", err)
	}
	return uint64(gen), nil
}

// SQL of CollectFences; $1..$3 are the live placements' namespaces, ids and generations.
const (
	liveSQL = `unnest($1::text[], $2::text[], $3::bigint[]) AS l(ns, id, generation)`
	// collectFloorSQL is statestore.CollectFloor: below ($4), lowered to every live placement
	// without a fence row.
	collectFloorSQL = `SELECT LEAST($4::bigint, min(l.generation)) FROM ` + liveSQL + `
WHERE NOT EXISTS (SELECT 1 FROM pinned_instance_fence f WHERE f.ns = l.ns AND f.id = l.id)`
	// lockCollectableSQL locks up to collectPage rows statestore.Collectable allows ($4: the
	// floor), skipping rows a writer holds: an instance in use is not collectable. Its tray
	// check only keeps instances with state out of the page; dropSQL's is the one that counts.
	lockCollectableSQL = `SELECT ns, id FROM pinned_instance_fence f
WHERE generation < $4 AND last_seq = 0
	AND NOT EXISTS (SELECT 1 FROM ` + liveSQL + ` WHERE l.ns = f.ns AND l.id = f.id)
	AND NOT EXISTS (SELECT 1 FROM pinned_tray_index t WHERE t.ns = f.ns AND t.id = f.id)
LIMIT ` + collectPage + `
FOR UPDATE SKIP LOCKED`
	// collectPage bounds the rows one CollectFences drops, so its transaction stays short; a
	// caller repeats the call while it drops something.
	collectPage = "10000"
	// dropSQL deletes the locked rows ($1, $2) whose instance holds no tray. It runs after the
	// rows are locked, so its snapshot sees every commit that touched their trays.
	dropSQL = `DELETE FROM pinned_instance_fence f USING unnest($1::text[], $2::text[]) AS c(ns, id)
WHERE f.ns = c.ns AND f.id = c.id
	AND NOT EXISTS (SELECT 1 FROM pinned_tray_index t WHERE t.ns = f.ns AND t.id = f.id)`
)

// CollectFences implements statestore.Store in one transaction that holds the floor row's lock,
// so collectors run one at a time and the drops commit together with the floor that fences
// their stale owners.
func (s *Store) CollectFences(ctx context.Context, below uint64, live []statestore.Live) (int, error) {
	if err := statestore.ValidateCollect(below, live); err != nil {
		return 0, fmt.Errorf("pgstore: collect fences: %w", err)
	}
	if err := s.usable(ctx); err != nil {
		return 0, s.wrap("collect fences", err)
	}
	nss := make([]string, len(live))
	ids := make([]string, len(live))
	gens := make([]int64, len(live))
	for i, l := range live {
		nss[i], ids[i], gens[i] = l.Inst.Namespace, l.Inst.ID, int64(l.Generation)
	}
	var n int
	err := pgx.BeginTxFunc(ctx, s.pool, beginTx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, floorSQL+` FOR UPDATE`); err != nil {
			return err
		}
		var floor int64
		if err := tx.QueryRow(ctx, collectFloorSQL, nss, ids, gens, int64(below)).Scan(&floor); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, lockCollectableSQL, nss, ids, gens, floor)
		if err != nil {
			return err
		}
		var cns, cids []string
		for rows.Next() {
			var ns, id string
			if err := rows.Scan(&ns, &id); err != nil {
				rows.Close()
				return err
			}
			cns, cids = append(cns, ns), append(cids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(cns) > 0 {
			tag, err := tx.Exec(ctx, dropSQL, cns, cids)
			if err != nil {
				return err
			}
			n = int(tag.RowsAffected())
		}
		_, err = tx.Exec(ctx, `UPDATE pinned_fence_floor SET generation = $1, updated_at = now() WHERE generation < $1`, floor)
		return err
	})
	if err != nil {
		return 0, s.wrap("collect fences", err)
	}
	return n, nil
}

// Close closes the pool, waiting for connections in use to be returned; later calls fail with
// ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.pool.Close()
	return nil
}

// Ping implements statestore.Pinger: one round trip to the server on a pooled connection.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.usable(ctx); err != nil {
		return s.wrap("ping", err)
	}
	return s.wrap("ping", s.pool.Ping(ctx))
}
