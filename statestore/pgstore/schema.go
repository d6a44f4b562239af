package pgstore

// migrations[i] brings the schema from version i to i+1. Append only: a released migration is
// never edited, since nodes that already ran it will not run it again.
//
// Text columns use COLLATE "C" so that Postgres orders keys by bytes, exactly like the other
// implementations (ListMarked pagination and Load order must not depend on the server's locale).
// There are no foreign keys: every write to an instance first locks its fence row, which already
// serializes writers, and the index row of a tray is derived at the end of each Commit.
var migrations = []string{
	// 1: trays, their fields and items, per-instance fences.
	`
CREATE TABLE pinned_instance_fence (
	ns         text COLLATE "C" NOT NULL,
	id         text COLLATE "C" NOT NULL,
	generation bigint NOT NULL CHECK (generation > 0),
	last_seq   bigint NOT NULL DEFAULT 0,  -- last seq handed out; never reset
	updated_at timestamptz NOT NULL DEFAULT now(),  -- when generation last rose
	PRIMARY KEY (ns, id)
);

CREATE TABLE pinned_tray_index (
	ns         text COLLATE "C" NOT NULL,
	id         text COLLATE "C" NOT NULL,
	tray_ns    text COLLATE "C" NOT NULL,
	tray_id    text COLLATE "C" NOT NULL,
	marked     boolean NOT NULL,
	generation bigint NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (ns, id, tray_ns, tray_id)
);

-- The leader's scanner lists instances with marked trays; most trays are unmarked.
CREATE INDEX pinned_tray_index_marked ON pinned_tray_index (ns, id) WHERE marked;

CREATE TABLE pinned_tray_fields (
	ns      text COLLATE "C" NOT NULL,
	id      text COLLATE "C" NOT NULL,
	tray_ns text COLLATE "C" NOT NULL,
	tray_id text COLLATE "C" NOT NULL,
	name    text COLLATE "C" NOT NULL,
	value   bytea NOT NULL,
	PRIMARY KEY (ns, id, tray_ns, tray_id, name)
);

CREATE TABLE pinned_tray_items (
	ns      text COLLATE "C" NOT NULL,
	id      text COLLATE "C" NOT NULL,
	tray_ns text COLLATE "C" NOT NULL,
	tray_id text COLLATE "C" NOT NULL,
	seq     bigint NOT NULL,
	payload bytea NOT NULL,
	applied boolean NOT NULL DEFAULT false,
	PRIMARY KEY (ns, id, tray_ns, tray_id, seq)
);
`,
	// 2: fences may be collected (statestore.Store.CollectFences); an instance without a fence
	// row takes no generation below the floor. One row, so collectors queue on its lock.
	`
CREATE TABLE pinned_fence_floor (
	one        boolean PRIMARY KEY DEFAULT true CHECK (one),
	generation bigint NOT NULL DEFAULT 0,
	updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pinned_fence_floor DEFAULT VALUES;
`,
}

const createVersionTable = `
CREATE TABLE IF NOT EXISTS pinned_schema_version (
	version    integer PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT now()
)`

// setupLockKey is the pg_advisory_xact_lock key that serializes Setup across nodes. Any
// constant works as long as nothing else in the database uses it; this one spells "pinnedst".
const setupLockKey int64 = 0x70696e6e65647374
