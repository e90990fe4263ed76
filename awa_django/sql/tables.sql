-- The tables of the awa schema: the ring-partitioned queue substrate and its control plane.
-- The functions that read and write them are in functions/, the views in views.sql; docs/
-- storage.md describes the planes and docs/design/ the decisions behind them.
--
-- Planes:
--   queue ring (ready_slot):  ready_entries, ready_tombstones, done_entries, done_counts
--   claim ring (claim_slot):  claims, claim_closures
--   lease ring (lease_slot):  leases
--   plain tables:             attempt_state, deferred_jobs, dlq_entries, unique_keys,
--                             serial_waiting, flow_waiting, callback_receipts, history_retries,
--                             workflows, workflow_steps, workflow_edges, workflow_waiting
--   control:                  queue_meta, queue_lanes, lane_floors, rings, ring_rotations,
--                             ring_prunes, runtime_instances, cron_schedules, flow_limits,
--                             flow_rate_state, flow_kind_limits, flow_kind_rate_state
--
-- Ring tables are appended on the hot path and reclaimed by TRUNCATE of whole sealed slots;
-- nothing on the hot path UPDATEs or DELETEs a ring row. Ring tables are internal: only the
-- engine's own functions write them. Each ring's partitions are rendered from the slot counts
-- in awa_django/sql/__init__.py (RING_SLOTS): lines between `--@each queue_slot` (or
-- claim_slot, lease_slot) and `--@end` are repeated once per slot.
--
-- Advisory-lock key spaces, one class per kind of object (two-int form):
--   4282177  lanes of producers, key lane_id
--   4282178  ring maintenance (rotate, prune), key awa._ring_key_v1(ring)
--   4282179  the callback of one job, key awa._job_key_v1(job_id)
--   4282180  migrations (awa_django/sql/queries/migrations.sql)
--   4282181  periodic schedule syncs
--   4282182  global-concurrency permits of queues and job kinds (functions/flow.sql)
--   4282183  serial keys' run locks, 4282184 their decision locks (functions/flow.sql)
--   4282185  the making of a hand-off lane, key hashtext(queue/priority) (functions/flow.sql)
-- The leader election uses the single-bigint key space (queries/storage.sql: leader_try).
CREATE SCHEMA awa;

-- Checks the tables use --------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION awa.valid_queue_name(p_queue text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_queue IS NOT NULL AND p_queue ~ '^[a-z0-9_.-]{1,63}$'
$$;

-- The bounds on job options, defined once for SQL (awa_django/limits.py holds Python's).
CREATE OR REPLACE FUNCTION awa.valid_priority(p_priority integer)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_priority IS NOT NULL AND p_priority BETWEEN -100 AND 100
$$;

CREATE OR REPLACE FUNCTION awa.valid_max_attempts(p_max_attempts integer)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_max_attempts IS NOT NULL AND p_max_attempts BETWEEN 1 AND 1000
$$;

-- The number of serial key p_key of queue p_queue (both lock classes use it). NULL: no key.
CREATE OR REPLACE FUNCTION awa._serial_lock_v1(p_queue text, p_key text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT hashtext(p_queue || '/' || p_key)
$$;

-- True, or SQLSTATE 22023 naming what is wrong with the retry policy in p_metadata (the CHECK
-- constraints below).
CREATE OR REPLACE FUNCTION awa._check_retry_policy_v1(p_metadata jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
 IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    v_error text := awa._retry_policy_error_v1(p_metadata -> 'awa:retry');
BEGIN
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION 'metadata: awa:retry: %', v_error USING ERRCODE = '22023';
    END IF;
    RETURN true;
END
$$;

CREATE TABLE awa.schema_migrations (
    name text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now(),
    -- The schema of the Django project's django_migrations table: whose installation this is.
    installed_for text
);

-- Job ids and the composite rows carried between planes -------------------------------------------

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

-- One claimed attempt as awa.claim_v3 returns it (a row with job_id NULL is the claim's marker:
-- timeout_secs the rate limit's hard wait, wait_secs a parked kind's next token).
CREATE TYPE awa.claimed_v3 AS (
    job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
    claim_slot integer, kind text, args jsonb, queue text, priority smallint,
    deadline_at timestamptz, timeout_secs double precision, progress jsonb,
    metadata jsonb, tags text[], errors jsonb, weight integer, permits integer[],
    serial_lock integer, wait_secs double precision);

-- Control plane -----------------------------------------------------------------------------------

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
-- the append-only claims (see awa.lane_cursor_v1). Shard 64 of a (queue, priority) is its
-- hand-off lane: jobs un-parked by their kind's limits are appended there, never by producers,
-- so they do not queue behind the lanes' backlog.
CREATE TABLE awa.queue_lanes (
    lane_id integer PRIMARY KEY,
    queue text NOT NULL CHECK (awa.valid_queue_name(queue)),
    priority smallint NOT NULL CHECK (awa.valid_priority(priority)),
    shard smallint NOT NULL CHECK (shard BETWEEN 0 AND 64),
    enqueue_seq regclass NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue, priority, shard)
) WITH (fillfactor = 50);

-- The highest lane position claimed by attempts whose claim slot has been truncated, as older
-- versions recorded it (still read by awa.lane_cursor_v1; prune now appends marker claims).
CREATE TABLE awa.lane_floors (
    lane_id integer PRIMARY KEY,
    floor_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE awa.rings (
    ring text PRIMARY KEY CHECK (ring IN ('queue', 'claim', 'lease')),
    slot_count integer NOT NULL CHECK (slot_count >= 4)
);

INSERT INTO awa.rings (ring, slot_count)
VALUES ('queue', {queue_slots}), ('claim', {claim_slots}), ('lease', {lease_slots});

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
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    -- What the process declares (awa.descriptors_report_v1): {"live_seconds": n, "queue":
    -- {name: hash}, "kind": {name: hash}}; NULL for a process that declares nothing.
    descriptors jsonb
) WITH (fillfactor = 70);

-- The queues and job kinds declared in code (label, description, owner, links), as the last
-- worker that reported each wrote it (awa.descriptors_report_v1), with the hash of the
-- declaration. Whether live workers declare it, and whether they agree, is derived from
-- awa.runtime_instances (the view awa.descriptor_status). Rows no live worker has declared
-- for DESCRIPTOR_RETENTION are deleted by the leader (awa.descriptors_prune_v1).
CREATE TABLE awa.descriptors (
    what text NOT NULL CHECK (what IN ('queue', 'kind')),
    name text NOT NULL,
    label text,
    description text,
    owner text,
    links jsonb,
    hash text NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (what, name)
);

-- Queue ring --------------------------------------------------------------------------------------

-- Immutable runnable job bodies: one row per emission (enqueue, promotion, DLQ retry). Only
-- first writes (run_lease 0: a producer's, a scheduled job's promotion) have their retry policy
-- checked: a retry's row is never refused (awa._backoff_v2 reads its policy and never raises).
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
    PRIMARY KEY (lane_id, lane_seq, ready_slot),
    CONSTRAINT ready_entries_retry_policy_check
        CHECK (run_lease > 0 OR metadata IS NULL OR NOT metadata ? 'awa:retry'
               OR awa._check_retry_policy_v1(metadata))
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

-- Exact terminal counts (docs/storage.md, "Counts"). Every statement that writes history appends
-- one delta per (ready slot, queue, state) it wrote, in its own transaction (xid, the top-level
-- transaction's id). The maintenance leader appends folds (folded_before set): a fold's n counts
-- every delta of its key whose transaction ended before folded_before (an xmin of a snapshot,
-- so none can commit later), its previous fold's included. A count is the key's latest fold
-- plus the deltas since. Append-only, in the queue ring's slots: truncated with the history it
-- counts, so no row of it is ever updated or deleted.
CREATE TABLE awa.done_counts (
    ready_slot integer NOT NULL,
    queue text NOT NULL,
    state text NOT NULL,
    n bigint NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    folded_before xid8
) PARTITION BY LIST (ready_slot);

--@each queue_slot
CREATE TABLE awa.ready_entries_{queue_slot} PARTITION OF awa.ready_entries FOR VALUES IN ({queue_slot});
CREATE TABLE awa.ready_tombstones_{queue_slot} PARTITION OF awa.ready_tombstones FOR VALUES IN ({queue_slot});
CREATE TABLE awa.done_entries_{queue_slot} PARTITION OF awa.done_entries FOR VALUES IN ({queue_slot});
CREATE TABLE awa.done_counts_{queue_slot} PARTITION OF awa.done_counts FOR VALUES IN ({queue_slot});
--@end

-- Claim ring --------------------------------------------------------------------------------------

-- One receipt per claimed attempt. "Open" = no matching closure (an anti-join over live slots).
-- kind is the claimed job's (copied into its terminal row by finalize); NULL is tolerated for
-- receipts written by raw SQL (see awa._finalize_pass_v1). A closed claim with job_id -lane_id
-- is a cursor marker, never an attempt (docs/design/derived-claim-cursor.md).
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

--@each claim_slot
CREATE TABLE awa.claims_{claim_slot} PARTITION OF awa.claims FOR VALUES IN ({claim_slot});
CREATE TABLE awa.claim_closures_{claim_slot} PARTITION OF awa.claim_closures FOR VALUES IN ({claim_slot});
--@end

-- Lease ring --------------------------------------------------------------------------------------

-- Materialised only for attempts that need mutable execution state (waiting for a callback).
-- A lease is live while its claim is open; it is never deleted, only truncated (its one update:
-- awa.callback_extend_v1 moves callback_timeout_at forward).
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

--@each lease_slot
CREATE TABLE awa.leases_{lease_slot} PARTITION OF awa.leases FOR VALUES IN ({lease_slot});
--@end

-- Indexes of the rings, declared on the parents: they cascade to every child.
CREATE INDEX ready_entries_job_idx ON awa.ready_entries (job_id);
CREATE INDEX ready_tombstones_job_idx ON awa.ready_tombstones (job_id);
CREATE INDEX done_entries_job_idx ON awa.done_entries (job_id);
CREATE INDEX claims_lane_idx ON awa.claims (lane_id, lane_seq);
CREATE INDEX claims_deadline_idx ON awa.claims (deadline_at) WHERE deadline_at IS NOT NULL;
-- Rescue scans read old claims by claim time; the ring keeps this index small (pruned slots).
CREATE INDEX claims_claimed_at_idx ON awa.claims (claimed_at);
CREATE INDEX leases_callback_idx ON awa.leases (callback_id) WHERE callback_id IS NOT NULL;

-- Ready rows of jobs with a serial key, by key, lane and position: the "older job of the key
-- still ready" test of claims and hand-offs reads a range of it per lane. Partial: rows without
-- a key (nearly all) cost nothing here.
CREATE INDEX ready_entries_serial_idx ON awa.ready_entries
    (awa._serial_lock_v1(queue, metadata ->> 'awa:serial'), lane_id, lane_seq, job_id)
    WHERE metadata ? 'awa:serial';

-- History indexes. done_entries is written once per finished job: these B-trees (and the kind in
-- claims and done rows) cost claim + finalize about 3 us of server CPU per job
-- (benchmarks/write_cost.py). Nothing more is indexed on ready_entries or claim_closures. The
-- outcome and DLQ indexes are written only for failures and cancellations.
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
-- A key's latest fold and the deltas since (awa._history_counts_v2), and the keys themselves.
CREATE INDEX done_counts_key_idx ON awa.done_counts (queue, state, ready_slot, folded_before, xid);

-- Plain tables ------------------------------------------------------------------------------------

-- Optional mutable state of one live attempt: heartbeat and progress. Created on the first
-- heartbeat or progress flush, deleted when the attempt ends. Short jobs never touch it.
-- callback_id: the attempt's registered callback, written before the handler can hand it out;
-- callback_result: a resolution that arrived before the attempt parked; callback_resume and
-- callback_timeout: what a parked attempt asked of its wait (a result resumes the job instead of
-- completing it; the default extension of a heartbeat), written by awa.finalize_v3;
-- callback_extend_to: an extension (a heartbeat) that arrived before the attempt parked, kept
-- for its wait.
CREATE TABLE awa.attempt_state (
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    progress jsonb,
    callback_result jsonb,
    updated_at timestamptz NOT NULL DEFAULT now(),
    callback_id uuid,
    callback_resume boolean,
    callback_timeout double precision,
    callback_extend_to timestamptz,
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
    progress jsonb,
    -- When the row was written: for a retryable row, when its attempt failed (queue charts).
    deferred_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT deferred_jobs_retry_policy_check
        CHECK (run_lease > 0 OR metadata IS NULL OR NOT metadata ? 'awa:retry'
               OR awa._check_retry_policy_v1(metadata))
);

CREATE INDEX deferred_jobs_due_idx ON awa.deferred_jobs (run_at, job_id);
CREATE INDEX deferred_jobs_queue_idx ON awa.deferred_jobs (queue, state);
CREATE INDEX deferred_jobs_retried_idx ON awa.deferred_jobs (queue, deferred_at)
    WHERE state = 'retryable';

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

-- Unique jobs (functions/unique.sql). A unique job holds a key here, taken in the producer's
-- transaction: the primary key makes two producers racing in separate transactions get one job.
-- The key is a SHA-256 digest of the kind and the key text (awa.unique_digest_v1). One insert,
-- then one update or delete per unique job, never per plain job.
CREATE TABLE awa.unique_keys (
    unique_key bytea PRIMARY KEY,
    job_id bigint NOT NULL,
    kind text NOT NULL,
    -- The start of the key text, for operators (the digest is what is unique).
    key_text text NOT NULL,
    states text[] NOT NULL,
    expires_at timestamptz,
    -- Changed by every take: the version a takeover or sweep compares against.
    taken_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX unique_keys_job_idx ON awa.unique_keys (job_id);
CREATE INDEX unique_keys_taken_idx ON awa.unique_keys (taken_at, unique_key);

-- Periodic schedules (functions/periodic.sql). fire_after, the exclusive lower bound of the
-- next fire time, only grows: one UPDATE per fire (one dead tuple per fire, bounded by
-- schedules x fire rate, not by jobs run).
CREATE TABLE awa.cron_schedules (
    name text PRIMARY KEY CHECK (name <> '' AND length(name) <= 200),
    kind text NOT NULL CHECK (kind <> '' AND length(kind) <= 255),
    cron_expr text NOT NULL CHECK (cron_expr <> '' AND length(cron_expr) <= 255),
    timezone text NOT NULL CHECK (timezone <> '' AND length(timezone) <= 255),
    catch_up integer NOT NULL CHECK (catch_up BETWEEN 1 AND 10000),
    queue text NOT NULL CHECK (awa.valid_queue_name(queue)),
    priority smallint NOT NULL CHECK (awa.valid_priority(priority)),
    max_attempts smallint NOT NULL CHECK (awa.valid_max_attempts(max_attempts)),
    args jsonb NOT NULL,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    fire_after timestamptz NOT NULL,
    last_fire_at timestamptz,
    last_job_id bigint,
    paused_at timestamptz,
    paused_by text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Flow limits per queue (functions/flow.sql): rows from the project's settings (source
-- 'settings', written by awa.flow_sync_v1 when a worker starts) and operator overrides (source
-- 'operator'), which settings syncs leave alone until cleared.
CREATE TABLE awa.flow_limits (
    queue text PRIMARY KEY CHECK (awa.valid_queue_name(queue)),
    max_running integer CHECK (max_running BETWEEN 1 AND 10000),
    rate double precision CHECK (rate >= 0.001 AND rate <= 1000000),
    burst integer CHECK (burst BETWEEN 1 AND 1000000),
    -- The highest max_running since every permit above max_running was last free.
    max_seen integer CHECK (max_seen BETWEEN 1 AND 10000),
    source text NOT NULL DEFAULT 'settings' CHECK (source IN ('settings', 'operator')),
    updated_by text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (burst IS NULL OR rate IS NOT NULL)
);

-- The GCRA state of a rate-limited queue: its theoretical arrival time, updated once per claim
-- that took jobs (dead tuples bounded by the claim rate, never by the job count).
CREATE TABLE awa.flow_rate_state (
    queue text PRIMARY KEY,
    tat timestamptz NOT NULL
) WITH (fillfactor = 50);

-- Flow limits per job kind, across every queue its jobs are in (functions/flow.sql).
CREATE TABLE awa.flow_kind_limits (
    -- A name with a control character is refused: listings print one kind per line.
    kind text PRIMARY KEY CHECK (length(kind) BETWEEN 1 AND 255
                                 AND kind !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]'),
    max_running integer CHECK (max_running BETWEEN 1 AND 10000),
    rate double precision CHECK (rate >= 0.001 AND rate <= 1000000),
    burst integer CHECK (burst BETWEEN 1 AND 1000000),
    -- The highest max_running since every permit above max_running was last free.
    max_seen integer CHECK (max_seen BETWEEN 1 AND 10000),
    source text NOT NULL DEFAULT 'settings' CHECK (source IN ('settings', 'operator')),
    updated_by text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (burst IS NULL OR rate IS NOT NULL)
);

-- The GCRA state of a rate-limited kind, made when its limit is set (the trigger on
-- flow_kind_limits, functions/flow.sql), so that no claim ever inserts it.
CREATE TABLE awa.flow_kind_rate_state (
    kind text PRIMARY KEY,
    tat timestamptz NOT NULL
) WITH (fillfactor = 50);

-- Jobs waiting for their serial key (functions/flow.sql, "Per-key serialisation").
CREATE TABLE awa.serial_waiting (
    job_id bigint PRIMARY KEY,
    lock_key integer NOT NULL,
    serial_key text NOT NULL,
    queue text NOT NULL,
    priority smallint NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb,
    parked_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX serial_waiting_key_idx ON awa.serial_waiting (lock_key, job_id);
CREATE INDEX serial_waiting_queue_idx ON awa.serial_waiting (queue, job_id);

-- Jobs parked by their kind's limits (the columns of awa.serial_waiting; serial_lock is the
-- job's serial key number, awa._serial_lock_v1, when it has a key).
CREATE TABLE awa.flow_waiting (
    job_id bigint PRIMARY KEY,
    serial_lock integer,
    queue text NOT NULL,
    priority smallint NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb,
    parked_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX flow_waiting_kind_idx ON awa.flow_waiting (kind, job_id);
-- (queue, kind, job_id): "any waiting in this queue" (a prefix probe), the kinds waiting in a
-- queue (a skip scan) and each kind's oldest there.
CREATE INDEX flow_waiting_queue_idx ON awa.flow_waiting (queue, kind, job_id);
CREATE INDEX flow_waiting_serial_idx ON awa.flow_waiting (serial_lock, job_id)
    WHERE serial_lock IS NOT NULL;

-- One row per request the signed callback receiver acted on: a resolution (at most one per
-- callback) or a heartbeat. request_digest is SHA-256 of the body for a resolution (a re-sent
-- resolution with the same body is the same resolution), of the timestamp and body for a
-- heartbeat. Kept while a replay of the request could still pass the receiver's timestamp
-- window (awa.callback_receipts_prune_v1).
CREATE TABLE awa.callback_receipts (
    callback_id uuid NOT NULL,
    request_digest bytea NOT NULL CHECK (octet_length(request_digest) = 32),
    action text NOT NULL CHECK (action IN ('resolve', 'heartbeat')),
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    outcome text NOT NULL,
    timeout_at timestamptz,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (callback_id, request_digest)
);

CREATE UNIQUE INDEX callback_receipts_resolution_idx
    ON awa.callback_receipts (callback_id) WHERE action = 'resolve';
CREATE INDEX callback_receipts_received_idx ON awa.callback_receipts (received_at);

-- One row per job retried from terminal history: the job, the job its retry enqueued, who asked
-- and when. A job is retried from history at most once while the row lives; rows older than the
-- history they refer to are deleted by awa.history_retry_v1 itself.
CREATE TABLE awa.history_retries (
    job_id bigint PRIMARY KEY,
    retry_job_id bigint,
    retried_by text,
    retried_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX history_retries_at_idx ON awa.history_retries (retried_at);

-- Workflows and batches (functions/workflows.sql, docs/workflows.md). A workflow is a set of
-- jobs (steps) and the edges between them, written in the producer's transaction; a batch is a
-- workflow whose members have no edges but to its callbacks. The counters of a workflow row
-- are moved by the statement that ends its steps, one update per statement and workflow (never
-- per job of other queues); finished_at is set when the last step ends.
CREATE SEQUENCE awa.workflow_id_seq AS bigint;

CREATE TABLE awa.workflows (
    workflow_id bigint PRIMARY KEY,
    name text NOT NULL CHECK (name <> '' AND length(name) <= 200),
    kind text NOT NULL CHECK (kind IN ('workflow', 'batch')),
    steps integer NOT NULL CHECK (steps > 0),
    completed integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    cancelled integer NOT NULL DEFAULT 0,
    skipped integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
) WITH (fillfactor = 70);

CREATE INDEX workflows_created_idx ON awa.workflows (created_at, workflow_id);
-- "Is any workflow open": the finalize's one probe before it looks for steps among its jobs.
CREATE INDEX workflows_open_idx ON awa.workflows (workflow_id) WHERE finished_at IS NULL;

-- One row per step, written once. on_failure: what the step does when a dependency fails or
-- is cancelled: 'cancel' it (and what needs it), 'skip' it (its own dependents go on), 'run' it
-- once every dependency has ended, or 'failed_only' (a batch's on_failure callback: run when
-- something failed, skipped when everything completed).
CREATE TABLE awa.workflow_steps (
    job_id bigint PRIMARY KEY,
    workflow_id bigint NOT NULL,
    step text NOT NULL,
    kind text NOT NULL,
    queue text NOT NULL,
    needs integer NOT NULL,
    on_failure text NOT NULL CHECK (on_failure IN ('cancel', 'skip', 'run', 'failed_only')),
    -- The steps that wait for this one (its edges' downstream ends; NULL: none), read by the
    -- settle of its end instead of an index probe of the edges.
    feeds bigint[],
    UNIQUE (workflow_id, step)
);

-- Dependencies, written once: downstream waits for upstream.
CREATE TABLE awa.workflow_edges (
    upstream bigint NOT NULL,
    downstream bigint NOT NULL,
    PRIMARY KEY (upstream, downstream)
);

CREATE INDEX workflow_edges_downstream_idx ON awa.workflow_edges (downstream);

-- Steps whose dependencies have not all ended: the job body (the columns of
-- awa.serial_waiting), the dependencies left and how those that ended ended. Updated once per
-- statement that ends some of its dependencies; deleted when the step is released to the
-- queue (or cancelled, or skipped). delay: seconds after its release that the step runs.
CREATE TABLE awa.workflow_waiting (
    job_id bigint PRIMARY KEY,
    workflow_id bigint NOT NULL,
    deps_left integer NOT NULL,
    completed integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    cancelled integer NOT NULL DEFAULT 0,
    skipped integer NOT NULL DEFAULT 0,
    delay double precision,
    queue text NOT NULL,
    priority smallint NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    max_attempts smallint NOT NULL,
    run_at timestamptz,
    created_at timestamptz NOT NULL,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    -- The ready ring's own check, so that a waiting step can always be released.
    CONSTRAINT workflow_waiting_retry_policy_check
        CHECK (metadata IS NULL OR NOT metadata ? 'awa:retry'
               OR awa._check_retry_policy_v1(metadata))
) WITH (fillfactor = 70);

CREATE INDEX workflow_waiting_workflow_idx ON awa.workflow_waiting (workflow_id);

-- Per queue and minute, for the admin's queue charts: what the minute finished (terminal history
-- by finalized_at, the DLQ by dlq_at), the retries it scheduled, the queue wait and run time of
-- its completed and failed jobs, and, for the newest minute of each roll-up, the queue's depth
-- as it was then. Written by the maintenance leader (awa.queue_minutes_record_v1) about 10 s
-- after each minute ends, and its outcomes counted again 5 minutes after: a row for each queue
-- with something to show, and one with the queue '' (no queue's name) for every minute rolled
-- up, which is how a reader tells a quiet minute from one nobody rolled up (its available: 0
-- when the depth was read for the minute; its recounted: whether the second count ran). Rows
-- older than 25 hours are deleted by the same function.
CREATE TABLE awa.queue_minutes (
    queue text NOT NULL,
    minute timestamptz NOT NULL,
    completed integer NOT NULL,
    failed integer NOT NULL,
    cancelled integer NOT NULL,
    dead_lettered integer NOT NULL,
    wait_p50 double precision,
    wait_p95 double precision,
    run_p50 double precision,
    run_p95 double precision,
    available bigint,
    retryable bigint,
    oldest_seconds double precision,
    recounted boolean NOT NULL DEFAULT false,
    retried integer NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute)
);

CREATE INDEX queue_minutes_minute_idx ON awa.queue_minutes (minute);

-- Per queue and minute of failure, the retries that left awa.deferred_jobs since: moved back
-- to the queue by promotion (awa.promote_v1), or cancelled while they waited (awa.cancel_v1,
-- awa.queue_drain_v2), each in the transaction that deletes them. A retry still waiting out
-- its backoff is a retryable row of awa.deferred_jobs; the two together are the retries the
-- minute scheduled (awa._queue_minute_outcomes_v2). Rows older than 25 hours are deleted with
-- awa.queue_minutes's.
CREATE TABLE awa.queue_minute_retries (
    queue text NOT NULL,
    minute timestamptz NOT NULL,
    retries integer NOT NULL,
    PRIMARY KEY (queue, minute)
);
