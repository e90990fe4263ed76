-- Changes to the tables since the settled schema was first written (before 0.1.0), for a
-- database whose tables an earlier development version created: on one that tables.sql created,
-- each statement does nothing. Folded into tables.sql, and this file emptied, at the release.

-- Whose installation the schema is (awa_django.db.migration: one schema, one project).
ALTER TABLE awa.schema_migrations ADD COLUMN IF NOT EXISTS installed_for text;

-- A callback extension that arrives before the attempt parks is kept for its wait.
ALTER TABLE awa.attempt_state ADD COLUMN IF NOT EXISTS callback_extend_to timestamptz;

-- The per-minute roll-up of each queue that the admin's queue charts read.
CREATE TABLE IF NOT EXISTS awa.queue_minutes (
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
    PRIMARY KEY (queue, minute)
);
ALTER TABLE awa.queue_minutes ADD COLUMN IF NOT EXISTS recounted boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS queue_minutes_minute_idx ON awa.queue_minutes (minute);
ALTER TABLE awa.queue_minutes ADD COLUMN IF NOT EXISTS retried integer NOT NULL DEFAULT 0;

-- Retries per minute in the queue charts: when a retryable row's attempt failed, and the
-- retries promotion has moved back to the queue.
ALTER TABLE awa.deferred_jobs ADD COLUMN IF NOT EXISTS deferred_at timestamptz NOT NULL
    DEFAULT now();
CREATE INDEX IF NOT EXISTS deferred_jobs_retried_idx ON awa.deferred_jobs (queue, deferred_at)
    WHERE state = 'retryable';
CREATE TABLE IF NOT EXISTS awa.queue_minute_retries (
    queue text NOT NULL,
    minute timestamptz NOT NULL,
    retries integer NOT NULL,
    PRIMARY KEY (queue, minute)
);

-- Descriptors: the queues and job kinds declared in code, and what each process declares.
ALTER TABLE awa.runtime_instances ADD COLUMN IF NOT EXISTS descriptors jsonb;
CREATE TABLE IF NOT EXISTS awa.descriptors (
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

-- Exact terminal counts: the table, and a delta per (slot, queue, state) for the history a
-- database already holds. SHARE mode holds off finalizes of workers still running the previous
-- functions until this commits, so that none of their rows is missed.
DO $upgrade$
DECLARE
    v_slot integer;
BEGIN
    IF to_regclass('awa.done_counts') IS NOT NULL THEN
        RETURN;
    END IF;
    CREATE TABLE awa.done_counts (
        ready_slot integer NOT NULL,
        queue text NOT NULL,
        state text NOT NULL,
        n bigint NOT NULL,
        xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
        folded_before xid8
    ) PARTITION BY LIST (ready_slot);
    -- One partition per slot of the database's queue ring (its count may predate RING_SLOTS).
    FOR v_slot IN 0 .. (SELECT r.slot_count - 1 FROM awa.rings r WHERE r.ring = 'queue') LOOP
        EXECUTE format('CREATE TABLE awa.done_counts_%s PARTITION OF awa.done_counts '
                       'FOR VALUES IN (%s)', v_slot, v_slot);
    END LOOP;
    CREATE INDEX done_counts_key_idx
        ON awa.done_counts (queue, state, ready_slot, folded_before, xid);
    LOCK TABLE awa.done_entries IN SHARE MODE;
    INSERT INTO awa.done_counts (ready_slot, queue, state, n)
    SELECT d.ready_slot, d.queue, d.state, count(*)
    FROM awa.done_entries d GROUP BY d.ready_slot, d.queue, d.state;
END
$upgrade$;

-- Workflows and batches (tables.sql has the comments). A workflow is a set of
-- jobs (steps) and the edges between them, written in the producer's transaction; a batch is a
-- workflow whose members have no edges but to its callbacks. The counters of a workflow row
-- are moved by the statement that ends its steps, one update per statement and workflow (never
-- per job of other queues); finished_at is set when the last step ends.
CREATE SEQUENCE IF NOT EXISTS awa.workflow_id_seq AS bigint;

CREATE TABLE IF NOT EXISTS awa.workflows (
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

CREATE INDEX IF NOT EXISTS workflows_created_idx ON awa.workflows (created_at, workflow_id);
-- "Is any workflow open": the finalize's one probe before it looks for steps among its jobs.
CREATE INDEX IF NOT EXISTS workflows_open_idx ON awa.workflows (workflow_id) WHERE finished_at IS NULL;

-- One row per step, written once. on_failure: what the step does when a dependency fails or
-- is cancelled: 'cancel' it (and what needs it), 'skip' it (its own dependents go on), 'run' it
-- once every dependency has ended, or 'failed_only' (a batch's on_failure callback: run when
-- something failed, skipped when everything completed).
CREATE TABLE IF NOT EXISTS awa.workflow_steps (
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
CREATE TABLE IF NOT EXISTS awa.workflow_edges (
    upstream bigint NOT NULL,
    downstream bigint NOT NULL,
    PRIMARY KEY (upstream, downstream)
);

CREATE INDEX IF NOT EXISTS workflow_edges_downstream_idx ON awa.workflow_edges (downstream);

-- Steps whose dependencies have not all ended: the job body (the columns of
-- awa.serial_waiting), the dependencies left and how those that ended ended. Updated once per
-- statement that ends some of its dependencies; deleted when the step is released to the
-- queue (or cancelled, or skipped). delay: seconds after its release that the step runs.
CREATE TABLE IF NOT EXISTS awa.workflow_waiting (
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

CREATE INDEX IF NOT EXISTS workflow_waiting_workflow_idx ON awa.workflow_waiting (workflow_id);
