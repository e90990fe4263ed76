-- awa_django schema v1: the ring-partitioned queue substrate (tables, sequences, partitions,
-- indexes). The functions and views that read and write it are in 0002_functions.sql.
--
-- Planes (see docs/storage.md):
--   queue ring (ready_slot):  ready_entries, ready_tombstones, done_entries
--   claim ring (claim_slot):  claims, claim_closures
--   lease ring (lease_slot):  leases
--   plain tables:             attempt_state, deferred_jobs, dlq_entries
--   control:                  queue_meta, queue_lanes, lane_floors, rings, ring_rotations,
--                             ring_prunes, runtime_instances
--
-- Ring tables are appended on the hot path and reclaimed by TRUNCATE of whole sealed slots;
-- nothing on the hot path UPDATEs or DELETEs a ring row. Ring tables are internal: only the
-- engine's own functions write them.

CREATE SCHEMA awa;

CREATE TABLE awa.schema_migrations (
    name text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION awa.valid_queue_name(p_queue text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_queue IS NOT NULL AND p_queue ~ '^[a-z0-9_.-]{1,63}$'
$$;

-- The bounds on job options, defined once for SQL (awa_django/limits.py holds Python's).
CREATE FUNCTION awa.valid_priority(p_priority integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_priority IS NOT NULL AND p_priority BETWEEN -100 AND 100
$$;

CREATE FUNCTION awa.valid_max_attempts(p_max_attempts integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_max_attempts IS NOT NULL AND p_max_attempts BETWEEN 1 AND 1000
$$;

-- Job ids and the composite body carried between planes --------------------------------------

CREATE SEQUENCE awa.job_id_seq AS bigint;
CREATE SEQUENCE awa.lane_id_seq AS integer;

-- One job body, as carried from a producer, the deferred plane or the DLQ into the ready ring.
-- attempt = attempts already made; run_lease = the last lease handed out (0 before any claim).
CREATE TYPE awa.job_body AS (
    job_id bigint,
    kind text,
    queue text,
    priority smallint,
    args jsonb,
    attempt smallint,
    max_attempts smallint,
    run_lease bigint,
    run_at timestamptz,
    created_at timestamptz,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb
);

-- Control plane -------------------------------------------------------------------------------

-- Queue metadata: pause flag, DLQ policy and the number of enqueue shards (lanes per priority).
-- A queue without a row behaves as unpaused, DLQ on, with the producer's default shard count.
CREATE TABLE awa.queue_meta (
    queue text PRIMARY KEY CHECK (awa.valid_queue_name(queue)),
    paused boolean NOT NULL DEFAULT false,
    dlq_enabled boolean NOT NULL DEFAULT true,
    enqueue_shards smallint NOT NULL DEFAULT 4 CHECK (enqueue_shards BETWEEN 1 AND 64),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A lane is one FIFO stream: (queue, priority, shard). The row is a stable registry entry and
-- the claim head: claim locks it FOR UPDATE SKIP LOCKED but never updates it. The enqueue cursor
-- is the lane's own sequence (sequences leave no dead tuples); the claim cursor is derived from
-- the append-only claims (see awa.lane_cursor_v1).
CREATE TABLE awa.queue_lanes (
    lane_id integer PRIMARY KEY,
    queue text NOT NULL CHECK (awa.valid_queue_name(queue)),
    priority smallint NOT NULL CHECK (awa.valid_priority(priority)),
    shard smallint NOT NULL CHECK (shard BETWEEN 0 AND 63),
    enqueue_seq regclass NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue, priority, shard)
) WITH (fillfactor = 50);

-- The highest lane position claimed by attempts whose claim slot has been truncated. Written only
-- by claim-ring prune, so it costs no dead tuples on the hot path.
CREATE TABLE awa.lane_floors (
    lane_id integer PRIMARY KEY,
    floor_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE awa.rings (
    ring text PRIMARY KEY CHECK (ring IN ('queue', 'claim', 'lease')),
    slot_count integer NOT NULL CHECK (slot_count >= 4)
);
INSERT INTO awa.rings (ring, slot_count) VALUES ('queue', 16), ('claim', 8), ('lease', 8);

-- Append-only rotation ledger: the current cursor of a ring is its max-generation row. Rotation
-- appends (generation + 1, (slot + 1) % slot_count); the primary key makes it a compare-and-swap.
CREATE TABLE awa.ring_rotations (
    ring text NOT NULL,
    generation bigint NOT NULL,
    slot integer NOT NULL,
    rotated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (ring, generation)
);
INSERT INTO awa.ring_rotations (ring, generation, slot)
VALUES ('queue', 0, 0), ('claim', 0, 0), ('lease', 0, 0);

-- Append-only prune ledger, one row per maintenance prune attempt outcome worth keeping.
CREATE TABLE awa.ring_prunes (
    ring text NOT NULL,
    slot integer NOT NULL,
    generation bigint NOT NULL,
    outcome text NOT NULL,
    detail text,
    pruned_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ring_prunes_ring_at_idx ON awa.ring_prunes (ring, pruned_at DESC);

CREATE TABLE awa.runtime_instances (
    instance_id uuid PRIMARY KEY,
    hostname text NOT NULL,
    pid integer NOT NULL,
    queues jsonb NOT NULL DEFAULT '{}',
    concurrency integer NOT NULL DEFAULT 0,
    version text,
    is_leader boolean NOT NULL DEFAULT false,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);

-- Queue ring ----------------------------------------------------------------------------------

-- Immutable runnable job bodies: one row per emission (enqueue, promotion, DLQ retry).
CREATE TABLE awa.ready_entries (
    ready_slot integer NOT NULL,
    ready_generation bigint NOT NULL,
    lane_id integer NOT NULL,
    lane_seq bigint NOT NULL,
    job_id bigint NOT NULL,
    priority smallint NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    queue text NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb,
    PRIMARY KEY (lane_id, lane_seq, ready_slot)
) PARTITION BY LIST (ready_slot);

-- Spent markers for unclaimed ready rows (cancel). Claim and exact counts skip them.
CREATE TABLE awa.ready_tombstones (
    ready_slot integer NOT NULL,
    ready_generation bigint NOT NULL,
    lane_id integer NOT NULL,
    lane_seq bigint NOT NULL,
    job_id bigint NOT NULL,
    tombstoned_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lane_id, lane_seq, ready_slot)
) PARTITION BY LIST (ready_slot);

-- Terminal facts. A ready-backed row (lane_id/lane_seq set) lives in the slot of its ready row
-- and takes its body from it; a wide row (lane_id NULL) carries its own body columns. Every row
-- names its kind (the writers copy it from the row they finish), so that history by kind is an
-- index range instead of a read of every body.
CREATE TABLE awa.done_entries (
    ready_slot integer NOT NULL,
    ready_generation bigint NOT NULL,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    lane_id integer,
    lane_seq bigint,
    state text NOT NULL CHECK (state IN ('completed', 'failed', 'cancelled')),
    attempt smallint NOT NULL,
    attempted_at timestamptz,
    finalized_at timestamptz NOT NULL DEFAULT now(),
    result jsonb,
    errors jsonb,
    progress jsonb,
    queue text NOT NULL,
    kind text NOT NULL,
    priority smallint,
    args jsonb,
    max_attempts smallint,
    run_at timestamptz,
    created_at timestamptz,
    metadata jsonb,
    tags text[]
) PARTITION BY LIST (ready_slot);

-- Claim ring ----------------------------------------------------------------------------------

-- One receipt per claimed attempt. "Open" = no matching closure (an anti-join over live slots).
-- kind is the claimed job's (copied into its terminal row by finalize); NULL is tolerated for
-- receipts written by raw SQL (see awa._finalize_pass_v1).
CREATE TABLE awa.claims (
    claim_slot integer NOT NULL,
    claim_generation bigint NOT NULL,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    ready_slot integer NOT NULL,
    ready_generation bigint NOT NULL,
    lane_id integer NOT NULL,
    lane_seq bigint NOT NULL,
    attempt smallint NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    deadline_at timestamptz,
    worker_id uuid,
    kind text,
    PRIMARY KEY (job_id, run_lease, claim_slot)
) PARTITION BY LIST (claim_slot);

-- Closure evidence. Its key makes a second closure of one attempt in one slot impossible, so of
-- two racing finalizers (worker, rescue, cancel) exactly one wins and the other learns it is stale.
CREATE TABLE awa.claim_closures (
    claim_slot integer NOT NULL,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    outcome text NOT NULL,
    closed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, run_lease, claim_slot)
) PARTITION BY LIST (claim_slot);

-- Lease ring ----------------------------------------------------------------------------------

-- Materialised only for attempts that need mutable execution state (waiting for a callback).
-- A lease is live while its claim is open; it is never updated or deleted, only truncated.
CREATE TABLE awa.leases (
    lease_slot integer NOT NULL,
    lease_generation bigint NOT NULL,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    claim_slot integer NOT NULL,
    state text NOT NULL CHECK (state IN ('running', 'waiting_external')),
    callback_id uuid,
    callback_timeout_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, run_lease, lease_slot)
) PARTITION BY LIST (lease_slot);

-- Ring children ---------------------------------------------------------------------------------

DO $$
DECLARE
    v_slot integer;
BEGIN
    FOR v_slot IN 0..15 LOOP
        EXECUTE format('CREATE TABLE awa.%I PARTITION OF awa.ready_entries FOR VALUES IN (%s)',
                       'ready_entries_' || v_slot, v_slot);
        EXECUTE format('CREATE TABLE awa.%I PARTITION OF awa.ready_tombstones FOR VALUES IN (%s)',
                       'ready_tombstones_' || v_slot, v_slot);
        EXECUTE format('CREATE TABLE awa.%I PARTITION OF awa.done_entries FOR VALUES IN (%s)',
                       'done_entries_' || v_slot, v_slot);
    END LOOP;
    FOR v_slot IN 0..7 LOOP
        EXECUTE format('CREATE TABLE awa.%I PARTITION OF awa.claims FOR VALUES IN (%s)',
                       'claims_' || v_slot, v_slot);
        EXECUTE format('CREATE TABLE awa.%I PARTITION OF awa.claim_closures FOR VALUES IN (%s)',
                       'claim_closures_' || v_slot, v_slot);
        EXECUTE format('CREATE TABLE awa.%I PARTITION OF awa.leases FOR VALUES IN (%s)',
                       'leases_' || v_slot, v_slot);
    END LOOP;
END
$$;

-- Indexes declared on the parents cascade to every child.
CREATE INDEX ready_entries_job_idx ON awa.ready_entries (job_id);
CREATE INDEX ready_tombstones_job_idx ON awa.ready_tombstones (job_id);
CREATE INDEX done_entries_job_idx ON awa.done_entries (job_id);
CREATE INDEX claims_lane_idx ON awa.claims (lane_id, lane_seq);
CREATE INDEX claims_deadline_idx ON awa.claims (deadline_at) WHERE deadline_at IS NOT NULL;
-- Rescue scans read old claims by claim time; the ring keeps this index small (pruned slots).
CREATE INDEX claims_claimed_at_idx ON awa.claims (claimed_at);
CREATE INDEX leases_callback_idx ON awa.leases (callback_id) WHERE callback_id IS NOT NULL;

-- History indexes. done_entries is written once per finished job: these B-trees (and the kind in
-- claims and done rows) cost claim + finalize about 3 us of server CPU per job
-- (benchmarks/write_cost.py, docs/performance.md). Nothing more is indexed on ready_entries or
-- claim_closures. The outcome and DLQ indexes are written only for failures and cancellations.
--
-- Terminal history newest first (the admin list, time filters, last-hour windows). In each
-- partition keys arrive in increasing order, so an insert takes the right-most leaf.
CREATE INDEX done_entries_finalized_btree_idx ON awa.done_entries (finalized_at, job_id);
-- Per queue and outcome: queue filters, capped exact counts, last-hour counts, throughput.
CREATE INDEX done_entries_queue_state_idx ON awa.done_entries (queue, state, finalized_at);
-- The failed and cancelled part of history only (completions never touch it): outcome filters.
CREATE INDEX done_entries_outcome_idx
    ON awa.done_entries (state, finalized_at, job_id) WHERE state <> 'completed';
-- History of one kind, newest first (the admin's kind filter and exact kind search).
CREATE INDEX done_entries_kind_idx ON awa.done_entries (kind, finalized_at, job_id);

-- Plain tables ----------------------------------------------------------------------------------

-- Optional mutable state of one live attempt: heartbeat and progress. Created on the first
-- heartbeat or progress flush, deleted when the attempt ends. Short jobs never touch it.
-- callback_id: the attempt's registered callback, written before the handler can hand it out;
-- callback_result: a resolution that arrived before the attempt parked.
CREATE TABLE awa.attempt_state (
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    progress jsonb,
    callback_result jsonb,
    updated_at timestamptz NOT NULL DEFAULT now(),
    callback_id uuid,
    PRIMARY KEY (job_id, run_lease)
) WITH (fillfactor = 80);
CREATE INDEX attempt_state_callback_idx ON awa.attempt_state (callback_id)
    WHERE callback_id IS NOT NULL;

-- Scheduled (future run_at, snoozed) and retryable (backoff) work, outside the claim path.
CREATE TABLE awa.deferred_jobs (
    job_id bigint PRIMARY KEY,
    state text NOT NULL CHECK (state IN ('scheduled', 'retryable')),
    queue text NOT NULL,
    priority smallint NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    attempted_at timestamptz,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb
);
CREATE INDEX deferred_jobs_due_idx ON awa.deferred_jobs (run_at, job_id);
CREATE INDEX deferred_jobs_queue_idx ON awa.deferred_jobs (queue, state);

-- Dead letter queue: full body of jobs that failed terminally on a queue with DLQ enabled.
CREATE TABLE awa.dlq_entries (
    job_id bigint PRIMARY KEY,
    queue text NOT NULL,
    priority smallint NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    original_run_lease bigint NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    attempted_at timestamptz,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb,
    dlq_reason text NOT NULL,
    dlq_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dlq_entries_queue_idx ON awa.dlq_entries (queue, dlq_at DESC);
CREATE INDEX dlq_entries_at_idx ON awa.dlq_entries (dlq_at);
-- Dead letters by kind (written on failure only).
CREATE INDEX dlq_entries_kind_idx ON awa.dlq_entries (kind, dlq_at);
