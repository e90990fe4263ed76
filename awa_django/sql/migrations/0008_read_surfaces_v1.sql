-- awa_django read surfaces v1: what the admin, the commands, get_result and SQL users read
-- costs what the live planes hold plus bounded index ranges of history, never a scan of
-- retained history, and keeps that plan whatever the statistics say. docs/storage.md ("Read
-- surfaces") states what every surface returns; docs/performance.md has the measurements.
--
-- Same names and column shapes as before (CREATE OR REPLACE). Released 0001-0007 unchanged.

-- Locks, in this order: claims first (a column added: no rewrite), then done_entries. A finalize
-- reads claims, then writes done_entries, so taking them the other way round deadlocked with a
-- running worker. The whole migration is one transaction: claims and finalization wait for it
-- (docs/storage.md, "Read surfaces").

-- The kind of the claimed job (NULL in claims made before 0008; see _finalize_pass_v1).
ALTER TABLE awa.claims ADD COLUMN kind text;

-- Every terminal row names its kind from 0008 on (the writers below copy it from the row they
-- finish), so that history by kind is an index range instead of a read of every body. Rows
-- written before take theirs from the ready row they are backed by (same slot, so it is there
-- as long as they are; 'unknown' if it ever is not), then the column is required.
UPDATE awa.done_entries d
SET kind = COALESCE((SELECT r.kind FROM awa.ready_entries r
                     WHERE r.lane_id = d.lane_id AND r.lane_seq = d.lane_seq
                       AND r.ready_slot = d.ready_slot), 'unknown')
WHERE d.kind IS NULL;
ALTER TABLE awa.done_entries ALTER COLUMN kind SET NOT NULL;
-- This rewrites each terminal row written before 0008 once, before the indexes below exist (a
-- dead version per row, gone when prune truncates its slot).

-- Indexes ---------------------------------------------------------------------------------------
--
-- done_entries is written once per finished job: three more B-trees there (and the kind in
-- claims and done rows) cost claim + finalize about 3 us of server CPU per job
-- (benchmarks/write_cost.py, docs/performance.md), partly paid back by dropping the BRIN index
-- the first one supersedes. Nothing is added to ready_entries or claim_closures. The outcome and
-- DLQ indexes are written only for failures and cancellations.

-- Terminal history newest first (the admin list, time filters, last-hour windows). In each
-- partition keys arrive in increasing order, so an insert takes the right-most leaf.
CREATE INDEX done_entries_finalized_btree_idx ON awa.done_entries (finalized_at, job_id);
DROP INDEX awa.done_entries_finalized_idx;
-- Per queue and outcome: queue filters, capped exact counts, last-hour counts, throughput.
CREATE INDEX done_entries_queue_state_idx ON awa.done_entries (queue, state, finalized_at);
-- The failed and cancelled part of history only (completions never touch it): outcome filters.
CREATE INDEX done_entries_outcome_idx
    ON awa.done_entries (state, finalized_at, job_id) WHERE state <> 'completed';
-- Dead letters by kind (written on failure only).
CREATE INDEX dlq_entries_kind_idx ON awa.dlq_entries (kind, dlq_at);

-- History of one kind, newest first (the admin's kind filter and exact kind search).
CREATE INDEX done_entries_kind_idx ON awa.done_entries (kind, finalized_at, job_id);

-- Live jobs ---------------------------------------------------------------------------------------

-- Jobs not finished yet, from the live planes only. Four things keep every plan bounded by the
-- live planes, whatever the statistics say (a volatile output column, plan_fence, keeps a
-- subquery from being flattened into the join while filters are still pushed into it):
--   * available: each lane's cursor and its highest position are read once per lane (init plans
--     of the per-lane subquery), and the lane's rows are read by that range of its primary key
--     (a range with both ends known is estimated small, so the planner reads it by index even
--     when statistics are missing). Flattened, this join could hash every retained ready row;
--     fenced, a lookup by id is still a probe of ready_entries_job_idx per lane;
--   * the body of a claimed job is one primary-key probe of its ready row per open claim,
--     after the claims are reduced to the open ones: with statistics of empty partitions the
--     planner otherwise hashed every retained ready row to find the bodies of a few thousand;
--   * running and waiting_external are two branches with constant states, so a state filter
--     removes a branch instead of being estimated at 0.5 % of the claim ring (which made the
--     planner nest a scan of a whole table inside a scan of every claim: of the closures in
--     the issue, of attempt_state in the benchmark); waiting_external
--     starts from the (few) waiting leases;
--   * queue is the lane's, so a queue filter starts from its lanes.
CREATE OR REPLACE VIEW awa.live_jobs AS
SELECT r.job_id AS id, r.kind, l.queue, 'available'::text AS state, r.priority, r.attempt,
       r.max_attempts, r.run_lease, r.args, r.run_at, r.created_at,
       NULL::timestamptz AS attempted_at, NULL::timestamptz AS finalized_at,
       NULL::timestamptz AS deadline_at, NULL::timestamptz AS heartbeat_at,
       r.errors, NULL::jsonb AS result, r.progress, r.metadata, r.tags,
       false AS in_dlq, NULL::text AS dlq_reason
FROM awa.queue_lanes l
CROSS JOIN LATERAL (
    SELECT e.job_id, e.kind, e.priority, e.attempt, e.max_attempts, e.run_lease, e.args,
           e.run_at, e.created_at, e.errors, e.progress, e.metadata, e.tags,
           random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = l.lane_id
      AND e.lane_seq > (SELECT awa.lane_cursor_v1(l.lane_id))
      AND e.lane_seq <= (SELECT max(x.lane_seq) FROM awa.ready_entries x
                         WHERE x.lane_id = l.lane_id)
      AND NOT EXISTS (
          SELECT 1 FROM awa.ready_tombstones t
          WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.ready_slot = e.ready_slot)
) r
UNION ALL
SELECT c.job_id, r.kind, l.queue, 'running', r.priority, c.attempt, r.max_attempts, c.run_lease,
       r.args, r.run_at, r.created_at, c.claimed_at, NULL, c.deadline_at, s.heartbeat_at,
       r.errors, NULL, COALESCE(s.progress, r.progress), r.metadata, r.tags, false, NULL
FROM (
    SELECT c.job_id, c.run_lease, c.lane_id, c.lane_seq, c.ready_slot, c.attempt, c.claimed_at,
           c.deadline_at, random() AS plan_fence
    FROM awa.claims c
    WHERE NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)
      AND NOT EXISTS (
              SELECT 1 FROM awa.leases ls
              WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                AND ls.state = 'waiting_external')
) c
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.progress, e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot
) r
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
UNION ALL
SELECT c.job_id, r.kind, l.queue, 'waiting_external', r.priority, c.attempt, r.max_attempts,
       c.run_lease, r.args, r.run_at, r.created_at, c.claimed_at, NULL, c.deadline_at,
       s.heartbeat_at, r.errors, NULL, COALESCE(s.progress, r.progress), r.metadata, r.tags,
       false, NULL
FROM (SELECT DISTINCT ls.job_id, ls.run_lease FROM awa.leases ls
      WHERE ls.state = 'waiting_external') w
JOIN awa.claims c ON c.job_id = w.job_id AND c.run_lease = w.run_lease
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.progress, e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot
) r
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
WHERE NOT EXISTS (
          SELECT 1 FROM awa.claim_closures z
          WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.claim_slot = c.claim_slot)
UNION ALL
SELECT d.job_id, d.kind, d.queue, d.state, d.priority, d.attempt, d.max_attempts, d.run_lease,
       d.args, d.run_at, d.created_at, d.attempted_at, NULL, NULL, NULL, d.errors, NULL,
       d.progress, d.metadata, d.tags, false, NULL
FROM awa.deferred_jobs d;

-- Terminal jobs -----------------------------------------------------------------------------------

-- Terminal facts hydrated with their retained bodies, as in 0002, with the body read by one
-- primary-key probe of the done row's ready row (in its own partition), whatever the
-- statistics say: with statistics of empty partitions the planner estimated a lookup by id at
-- 0.5 % of history and hashed every retained ready row to hydrate it. Newest first, by outcome,
-- by queue, by kind and by finished time are index ranges of done_entries (the indexes above).
CREATE OR REPLACE VIEW awa.terminal_jobs AS
SELECT d.job_id AS id,
       d.kind,
       d.queue,
       d.state,
       COALESCE(d.priority, r.priority) AS priority,
       d.attempt,
       COALESCE(d.max_attempts, r.max_attempts) AS max_attempts,
       d.run_lease,
       COALESCE(d.args, r.args) AS args,
       COALESCE(d.run_at, r.run_at) AS run_at,
       COALESCE(d.created_at, r.created_at) AS created_at,
       d.attempted_at,
       d.finalized_at,
       COALESCE(d.errors, r.errors) AS errors,
       d.result,
       d.progress,
       COALESCE(d.metadata, r.metadata) AS metadata,
       COALESCE(d.tags, r.tags) AS tags,
       d.ready_slot,
       d.ready_generation
FROM awa.done_entries d
LEFT JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = d.lane_id AND e.lane_seq = d.lane_seq AND e.ready_slot = d.ready_slot
) r ON true;

-- Counts ------------------------------------------------------------------------------------------

-- Terminal history per queue and outcome: exact up to p_cap rows per (queue, state) (an index
-- range of done_entries_queue_state_idx that stops at p_cap + 1 rows); beyond that, an estimate
-- scaled from a sample of about p_sample_pages pages of history (TABLESAMPLE SYSTEM ...
-- REPEATABLE: the same pages while history does not change), never below p_cap + 1. exact says
-- which. Costs at most queues x 3 x (p_cap + 1) index entries plus the sample, whatever history
-- holds. Queues come from history itself (a skip scan of the same index: one probe per queue).
CREATE FUNCTION awa._history_counts_v1(p_cap integer DEFAULT 10000,
                                       p_sample_pages integer DEFAULT 1000)
RETURNS TABLE (queue text, state text, n bigint, exact boolean)
LANGUAGE plpgsql STABLE
-- Index ranges that stop at p_cap + 1 rows: a bitmap scan would read each range to its end.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_pages double precision;
    v_pct double precision;
BEGIN
    SELECT sum(pg_relation_size(i.inhrelid)) / current_setting('block_size')::double precision
    INTO v_pages
    FROM pg_inherits i WHERE i.inhparent = 'awa.done_entries'::regclass;
    v_pct := LEAST(100, 100.0 * GREATEST(p_sample_pages, 1) / GREATEST(v_pages, 1));
    RETURN QUERY
    WITH RECURSIVE names AS (
        (SELECT d.queue FROM awa.done_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.done_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM names q WHERE q.queue IS NOT NULL
    ), capped AS MATERIALIZED (
        SELECT q.queue, s.state, x.n
        FROM names q
        CROSS JOIN (VALUES ('completed'), ('failed'), ('cancelled')) AS s (state)
        CROSS JOIN LATERAL (
            SELECT count(*) AS n
            FROM (SELECT 1 FROM awa.done_entries d
                  WHERE d.queue = q.queue AND d.state = s.state
                  LIMIT p_cap + 1) y) x
        WHERE q.queue IS NOT NULL
    ), sampled AS (
        SELECT d.queue, d.state, count(*) AS n
        FROM awa.done_entries d TABLESAMPLE SYSTEM (v_pct) REPEATABLE (0)
        WHERE EXISTS (SELECT 1 FROM capped c WHERE c.n > p_cap)
        GROUP BY d.queue, d.state
    )
    SELECT c.queue, c.state,
           CASE WHEN c.n <= p_cap THEN c.n
                ELSE GREATEST(p_cap + 1, round(COALESCE(m.n, 0) * 100.0 / v_pct))::bigint END,
           c.n <= p_cap
    FROM capped c
    LEFT JOIN sampled m ON m.queue = c.queue AND m.state = c.state
    WHERE c.n > 0;
END
$$;

-- Counts per queue and state. Live planes (available, running, waiting_external, scheduled,
-- retryable, dlq) are exact; terminal history (completed, failed, cancelled) is exact up to
-- 10,000 per queue and outcome and estimated beyond (awa._history_counts_v1). Costs what the
-- live planes hold plus a bounded part of history.
CREATE OR REPLACE FUNCTION awa.queue_counts_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean)
LANGUAGE sql STABLE
-- The open claims are an anti-join of the claim ring with its closures (about 80 s of claims):
-- hashed in memory rather than in batches on disk.
SET work_mem = '32MB'
AS $$
    WITH live AS (
        SELECT j.queue, j.state, count(*) AS n
        FROM awa.live_jobs j
        GROUP BY j.queue, j.state
    ), done AS (
        SELECT h.queue, h.state, h.n FROM awa._history_counts_v1() h
    ), dead AS (
        SELECT q.queue, 'dlq'::text AS state, count(*) AS n FROM awa.dlq_entries q GROUP BY q.queue
    ), allq AS (
        SELECT * FROM live UNION ALL SELECT * FROM done UNION ALL SELECT * FROM dead
    ), names AS (
        SELECT a.queue FROM allq a UNION SELECT m.queue FROM awa.queue_meta m
    )
    SELECT n.queue,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'available'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'running'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'waiting_external'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'scheduled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'retryable'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'completed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'failed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'cancelled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'dlq'), 0)::bigint,
           COALESCE((SELECT m.paused FROM awa.queue_meta m WHERE m.queue = n.queue), false)
    FROM names n
    LEFT JOIN allq a ON a.queue = n.queue
    GROUP BY n.queue
    ORDER BY n.queue
$$;

-- Jobs of one queue completed since p_since (the last hour, for queue_stats_v1): an index range
-- of done_entries_queue_state_idx, newest first.
CREATE FUNCTION awa._completed_since_v1(p_queue text, p_since timestamptz)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM awa.done_entries d
    WHERE d.queue = p_queue AND d.state = 'completed' AND d.finalized_at > p_since
$$;

-- Per queue: the counts of queue_counts_v1, the age of the oldest available job (lag, seconds)
-- and the jobs completed in the last hour.
CREATE OR REPLACE FUNCTION awa.queue_stats_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean, lag_seconds double precision,
               completed_last_hour bigint)
LANGUAGE sql STABLE
SET work_mem = '32MB'
AS $$
    SELECT c.*,
           (SELECT extract(epoch FROM now() - min(j.run_at)) FROM awa.live_jobs j
            WHERE j.queue = c.queue AND j.state = 'available'),
           awa._completed_since_v1(c.queue, now() - interval '1 hour')
    FROM awa.queue_counts_v1() c
$$;

-- Every queue that queue_counts_v1() reports (one with metadata, history, deferred jobs or dead
-- letters), from the control table and a skip scan of each plane's queue index (one probe per
-- queue), without computing any statistic.
CREATE FUNCTION awa._queue_names_v1()
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE done_q AS (
        (SELECT d.queue FROM awa.done_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.done_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM done_q q WHERE q.queue IS NOT NULL
    ), deferred_q AS (
        (SELECT d.queue FROM awa.deferred_jobs d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.deferred_jobs d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM deferred_q q WHERE q.queue IS NOT NULL
    ), dlq_q AS (
        (SELECT d.queue FROM awa.dlq_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.dlq_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM dlq_q q WHERE q.queue IS NOT NULL
    )
    SELECT m.queue FROM awa.queue_meta m
    UNION SELECT q.queue FROM done_q q WHERE q.queue IS NOT NULL
    UNION SELECT q.queue FROM deferred_q q WHERE q.queue IS NOT NULL
    UNION SELECT q.queue FROM dlq_q q WHERE q.queue IS NOT NULL
$$;

-- The admin's queue list. Same rows as queue_stats_v1(), but a query that reads only the queue
-- names (the admin's capped count of the list) computes no statistic: the statistics are
-- computed once per query, when a column needs them.
CREATE OR REPLACE VIEW awa.queue_stats AS
WITH s AS MATERIALIZED (SELECT * FROM awa.queue_stats_v1())
SELECT n.queue,
       COALESCE((SELECT s.available FROM s WHERE s.queue = n.queue), 0) AS available,
       COALESCE((SELECT s.running FROM s WHERE s.queue = n.queue), 0) AS running,
       COALESCE((SELECT s.waiting_external FROM s WHERE s.queue = n.queue), 0)
           AS waiting_external,
       COALESCE((SELECT s.scheduled FROM s WHERE s.queue = n.queue), 0) AS scheduled,
       COALESCE((SELECT s.retryable FROM s WHERE s.queue = n.queue), 0) AS retryable,
       COALESCE((SELECT s.completed FROM s WHERE s.queue = n.queue), 0) AS completed,
       COALESCE((SELECT s.failed FROM s WHERE s.queue = n.queue), 0) AS failed,
       COALESCE((SELECT s.cancelled FROM s WHERE s.queue = n.queue), 0) AS cancelled,
       COALESCE((SELECT s.dlq FROM s WHERE s.queue = n.queue), 0) AS dlq,
       COALESCE((SELECT s.paused FROM s WHERE s.queue = n.queue), false) AS paused,
       (SELECT s.lag_seconds FROM s WHERE s.queue = n.queue) AS lag_seconds,
       COALESCE((SELECT s.completed_last_hour FROM s WHERE s.queue = n.queue), 0)
           AS completed_last_hour
FROM awa._queue_names_v1() AS n (queue);

-- Completions per minute of the last hour for one queue (NULL: all), oldest first, 60 buckets:
-- one index range of the last hour (every outcome of the last hour when p_queue is NULL; the
-- queue's completions only otherwise), whatever the statistics say.
CREATE OR REPLACE FUNCTION awa.throughput_v1(p_queue text DEFAULT NULL)
RETURNS TABLE (minute timestamptz, completed bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_start timestamptz := date_trunc('minute', now()) - interval '59 minutes';
BEGIN
    IF p_queue IS NULL THEN
        RETURN QUERY
        SELECT g.minute, COALESCE(c.n, 0)::bigint
        FROM generate_series(v_start, v_start + interval '59 minutes', interval '1 minute')
             AS g (minute)
        LEFT JOIN (
            SELECT date_trunc('minute', d.finalized_at) AS minute,
                   count(*) FILTER (WHERE d.state = 'completed') AS n
            FROM awa.done_entries d
            WHERE d.finalized_at >= v_start
            GROUP BY 1) c ON c.minute = g.minute
        ORDER BY g.minute;
    ELSE
        RETURN QUERY
        SELECT g.minute, COALESCE(c.n, 0)::bigint
        FROM generate_series(v_start, v_start + interval '59 minutes', interval '1 minute')
             AS g (minute)
        LEFT JOIN (
            SELECT date_trunc('minute', d.finalized_at) AS minute, count(*) AS n
            FROM awa.done_entries d
            WHERE d.queue = p_queue AND d.state = 'completed' AND d.finalized_at >= v_start
            GROUP BY 1) c ON c.minute = g.minute
        ORDER BY g.minute;
    END IF;
END
$$;

-- Rings ------------------------------------------------------------------------------------------

-- Per ring and slot: the rows its children hold and the last prune outcome. rows is exact for
-- children of up to 1,000 pages (8 MB); a bigger child is estimated from its size and the row
-- density PostgreSQL last measured (pg_class), as the planner does, or, when it has none, from a
-- sample of about 100 of its pages. This never counts history row by row.
CREATE OR REPLACE FUNCTION awa.ring_slots_v1()
RETURNS TABLE (ring text, slot integer, is_current boolean, rows bigint, last_prune text,
               last_prune_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    g record;
    v_slot integer;
    v_table text;
    v_rows bigint;
    v_n bigint;
    v_pages double precision;
    v_relpages double precision;
    v_reltuples double precision;
BEGIN
    FOR g IN SELECT s.ring, s.slot_count, s.current_slot FROM awa.ring_state s ORDER BY s.ring LOOP
        FOR v_slot IN 0..(g.slot_count - 1) LOOP
            v_rows := 0;
            FOREACH v_table IN ARRAY awa._ring_children_v1(g.ring, v_slot) LOOP
                SELECT pg_relation_size(c.oid) / current_setting('block_size')::double precision,
                       c.relpages, c.reltuples
                INTO v_pages, v_relpages, v_reltuples
                FROM pg_class c
                WHERE c.oid = format('awa.%I', v_table)::regclass;
                IF v_pages <= 1000 THEN
                    EXECUTE format('SELECT count(*) FROM awa.%I', v_table) INTO v_n;
                ELSIF v_relpages > 0 AND v_reltuples > 0 THEN
                    v_n := round(v_reltuples / v_relpages * v_pages);
                ELSE
                    EXECUTE format('SELECT round(count(*) * %s) FROM awa.%I '
                                   'TABLESAMPLE SYSTEM (%s) REPEATABLE (0)',
                                   v_pages / 100, v_table, 10000 / v_pages) INTO v_n;
                END IF;
                v_rows := v_rows + v_n;
            END LOOP;
            ring := g.ring;
            slot := v_slot;
            is_current := v_slot = g.current_slot;
            rows := v_rows;
            SELECT p.outcome, p.pruned_at INTO last_prune, last_prune_at
            FROM awa.ring_prunes p WHERE p.ring = g.ring AND p.slot = v_slot
            ORDER BY p.pruned_at DESC LIMIT 1;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

-- Writers of terminal rows ------------------------------------------------------------------------

-- The bodies of 0002 (_finalize_pass_v1), 0003 (_carry_claims_v1) and 0007 (claim_v1, cancel_v1,
-- queue_drain_v2), each writing the job's kind into the terminal row it adds (done_entries.kind is
-- required from here on). A completion takes it from its claim, which claim_v1 writes from the
-- ready row it already reads and a carry-forward copies: a primary-key probe of the ready row
-- per completion cost about 3 us of server CPU per job (benchmarks/write_cost.py).

-- claim_v1 also returns the job's metadata, tags and the errors of its previous attempts (for
-- the handler's context; mostly NULL, so nearly free): a new result type, so dropped and made
-- again (a caller naming the columns it reads is unaffected).
DROP FUNCTION awa.claim_v1(text, integer, uuid, double precision, double precision);
CREATE FUNCTION awa.claim_v1(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
               claim_slot integer, kind text, args jsonb, queue text, priority smallint,
               deadline_at timestamptz, timeout_secs double precision, progress jsonb,
               metadata jsonb, tags text[], errors jsonb)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_remaining integer := p_max;
    v_got integer;
    v_cursor bigint;
    v_cslot integer;
    v_cgen bigint;
    v_aging double precision := GREATEST(COALESCE(p_aging_secs, 60), 0.001);
    v_default double precision := awa._deadline_secs_v1(p_default_deadline);
    r record;
BEGIN
    IF p_max IS NULL OR p_max <= 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.claim_v1 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused) THEN
        RETURN;
    END IF;
    SELECT r2.generation, r2.slot INTO v_cgen, v_cslot
    FROM awa.ring_rotations r2 WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1;

    FOR r IN
        WITH k AS MATERIALIZED (
            SELECT l.lane_id, l.priority, l.enqueue_seq, awa.lane_cursor_v1(l.lane_id) AS c
            FROM awa.queue_lanes l
            WHERE l.queue = p_queue
        )
        SELECT k.lane_id
        FROM k
        CROSS JOIN LATERAL (
            SELECT e.run_at FROM awa.ready_entries e
            WHERE e.lane_id = k.lane_id AND e.lane_seq > k.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq LIMIT 1) h
        WHERE COALESCE(pg_sequence_last_value(k.enqueue_seq), 0) > k.c
        ORDER BY k.priority + floor(extract(epoch FROM now() - h.run_at) / v_aging) DESC,
                 h.run_at, k.lane_id
    LOOP
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        v_cursor := awa.lane_cursor_v1(r.lane_id);
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT e.*, COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default) AS timeout
            FROM awa.ready_entries e
            WHERE e.lane_id = r.lane_id AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout),
                   p_worker, p.kind
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint, p.max_attempts, v_cslot,
               p.kind, p.args, p.queue, p.priority, i.deadline_at, p.timeout, p.progress,
               p.metadata, p.tags, p.errors
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq
        ORDER BY p.lane_seq;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_remaining := v_remaining - v_got;
        EXIT WHEN v_remaining <= 0;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION awa._carry_claims_v1(p_slot integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_gen bigint;
    v_cur integer;
    v_n integer;
BEGIN
    SELECT generation, slot INTO v_gen, v_cur
    FROM awa.ring_rotations WHERE ring = 'claim' ORDER BY generation DESC LIMIT 1;
    IF v_cur = p_slot THEN
        RETURN 0;
    END IF;
    WITH open AS (
        SELECT c.* FROM awa.claims c
        WHERE c.claim_slot = p_slot
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)
    ), closed AS (
        INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
        SELECT p_slot, o.job_id, o.run_lease, 'carried' FROM open o
        ON CONFLICT DO NOTHING
        RETURNING job_id, run_lease
    ), moved AS (
        INSERT INTO awa.claims (
            claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
            lane_id, lane_seq, attempt, claimed_at, deadline_at, worker_id, kind)
        SELECT v_cur, v_gen, o.job_id, o.run_lease, o.ready_slot, o.ready_generation, o.lane_id,
               o.lane_seq, o.attempt, o.claimed_at, o.deadline_at, o.worker_id, o.kind
        FROM open o JOIN closed k ON k.job_id = o.job_id AND k.run_lease = o.run_lease
        RETURNING 1
    )
    SELECT count(*) INTO v_n FROM moved;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION awa._finalize_pass_v1(p_items jsonb, p_hint boolean)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_stale jsonb;
BEGIN
    WITH items AS (
        SELECT x.*, e.value AS raw
        FROM jsonb_array_elements(p_items) AS e(value),
             jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, outcome text,
                 result jsonb, error jsonb, delay double precision, progress jsonb, st boolean,
                 closed_as text)
    ), cl AS MATERIALIZED (
        -- A lateral lookup (not a join) keeps the row estimate at the item count, so the
        -- planner hash-joins the CTEs below instead of nesting loops over them.
        SELECT i.id, i.lease, i.outcome, i.result, i.error, i.delay, i.progress,
               COALESCE(i.st, false) AS st, COALESCE(i.closed_as, i.outcome) AS closed_as,
               c.claim_slot, c.ready_slot, c.ready_generation,
               c.lane_id, c.lane_seq, c.attempt, c.claimed_at, c.kind AS claim_kind
        FROM items i
        CROSS JOIN LATERAL (
            SELECT c.* FROM awa.claims c
            WHERE c.job_id = i.id AND c.run_lease = i.lease
              AND (c.claim_slot = i.slot OR NOT p_hint)
              AND (p_hint OR NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot))
            LIMIT 1) c
    ), closed AS (
        INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
        SELECT claim_slot, id, lease, closed_as FROM cl
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    ), won AS MATERIALIZED (
        SELECT cl.* FROM cl
        JOIN closed k ON k.job_id = cl.id AND k.run_lease = cl.lease AND k.claim_slot = cl.claim_slot
    ), completed AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, result, queue, kind)
        SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq, 'completed',
               w.attempt, w.claimed_at, w.result, l.queue,
               -- Claims made before 0008 do not name their kind: read it from the ready row.
               COALESCE(w.claim_kind, (SELECT r.kind FROM awa.ready_entries r
                                 WHERE r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
                                   AND r.ready_slot = w.ready_slot))
        FROM won w JOIN awa.queue_lanes l ON l.lane_id = w.lane_id
        WHERE w.outcome = 'completed'
    ), other AS MATERIALIZED (
        SELECT w.*, r.queue, r.priority, r.kind, r.args, r.max_attempts, r.run_at, r.created_at,
               r.deadline_secs, r.metadata, r.tags,
               CASE WHEN w.outcome = 'snooze' THEN r.errors
                    ELSE COALESCE(r.errors, '[]'::jsonb) || jsonb_build_array(
                        COALESCE(w.error, jsonb_build_object('message', w.outcome))
                        || jsonb_build_object('attempt', w.attempt, 'at', now()))
               END AS new_errors,
               COALESCE(w.progress, s.progress, r.progress) AS new_progress,
               CASE
                   WHEN w.outcome = 'snooze' THEN 'scheduled'
                   WHEN w.outcome = 'cancel' THEN 'cancelled'
                   WHEN w.outcome = 'retry' AND w.attempt < r.max_attempts THEN 'retryable'
                   WHEN COALESCE(m.dlq_enabled, true) THEN 'dlq'
                   ELSE 'failed'
               END AS dest
        FROM won w
        JOIN awa.ready_entries r
          ON r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq AND r.ready_slot = w.ready_slot
        LEFT JOIN awa.queue_meta m ON m.queue = r.queue
        LEFT JOIN awa.attempt_state s ON w.st AND s.job_id = w.id AND s.run_lease = w.lease
        WHERE w.outcome <> 'completed'
    ), terminal AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, errors, progress, queue, kind)
        SELECT o.ready_slot, o.ready_generation, o.id, o.lease, o.lane_id, o.lane_seq, o.dest,
               o.attempt, o.claimed_at, o.new_errors, o.new_progress, o.queue, o.kind
        FROM other o WHERE o.dest IN ('cancelled', 'failed')
    ), deferred AS (
        INSERT INTO awa.deferred_jobs (
            job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
            created_at, attempted_at, deadline_secs, metadata, tags, errors, progress)
        SELECT o.id, o.dest, o.queue, o.priority, o.kind, o.args,
               CASE WHEN o.dest = 'scheduled' THEN o.attempt - 1 ELSE o.attempt END,
               o.max_attempts, o.lease,
               now() + make_interval(secs => COALESCE(
                   o.delay,
                   CASE WHEN o.dest = 'retryable'
                        THEN LEAST(power(2, o.attempt) * (1 + random() * 0.25), 86400)
                        ELSE 0 END)),
               o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags, o.new_errors,
               o.new_progress
        FROM other o WHERE o.dest IN ('scheduled', 'retryable')
    ), dead AS (
        INSERT INTO awa.dlq_entries (
            job_id, queue, priority, kind, args, attempt, max_attempts, run_lease,
            original_run_lease, run_at, created_at, attempted_at, deadline_secs, metadata, tags,
            errors, progress, dlq_reason)
        SELECT o.id, o.queue, o.priority, o.kind, o.args, o.attempt, o.max_attempts, o.lease,
               o.lease, o.run_at, o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags,
               o.new_errors, o.new_progress,
               CASE WHEN o.outcome = 'retry' THEN 'max_attempts exhausted: '
                    ELSE 'terminal error: ' END
               || COALESCE(o.error ->> 'message', o.outcome)
        FROM other o WHERE o.dest = 'dlq'
    ), cleared AS (
        DELETE FROM awa.attempt_state s
        USING won w
        WHERE w.st AND s.job_id = w.id AND s.run_lease = w.lease
    )
    SELECT jsonb_agg(i.raw) INTO v_stale
    FROM items i
    WHERE NOT EXISTS (SELECT 1 FROM closed k WHERE k.job_id = i.id AND k.run_lease = i.lease);
    RETURN v_stale;
END
$$;

CREATE OR REPLACE FUNCTION awa.cancel_v1(p_job_id bigint, p_reason text DEFAULT 'cancelled')
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_try integer := 0;
    v_gen bigint;
    v_slot integer;
    v_state text;
    d awa.deferred_jobs%ROWTYPE;
    c awa.claims%ROWTYPE;
    r awa.ready_entries%ROWTYPE;
    v_error jsonb := jsonb_build_object('type', 'Cancelled', 'message', COALESCE(p_reason, 'cancelled'));
BEGIN
    PERFORM awa._require_read_committed_v1('awa.cancel_v1');
    WHILE v_try < 5 LOOP
        v_try := v_try + 1;

        DELETE FROM awa.deferred_jobs WHERE job_id = p_job_id RETURNING * INTO d;
        IF FOUND THEN
            SELECT generation, slot INTO v_gen, v_slot
            FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
                errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
                metadata, tags)
            VALUES (v_slot, v_gen, d.job_id, d.run_lease, 'cancelled', d.attempt, d.attempted_at,
                    COALESCE(d.errors, '[]'::jsonb)
                    || jsonb_build_array(v_error || jsonb_build_object('attempt', d.attempt, 'at', now())),
                    d.progress, d.kind, d.queue, d.priority, d.args, d.max_attempts, d.run_at,
                    d.created_at, d.metadata, d.tags);
            RETURN d.state;
        END IF;

        SELECT * INTO c FROM awa.claims cl
        WHERE cl.job_id = p_job_id
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = cl.job_id AND z.run_lease = cl.run_lease AND z.claim_slot = cl.claim_slot)
        ORDER BY cl.run_lease DESC LIMIT 1;
        IF FOUND THEN
            INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
            VALUES (c.claim_slot, c.job_id, c.run_lease, 'cancel')
            ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                CONTINUE;  -- another closer won; look again
            END IF;
            v_state := CASE WHEN EXISTS (
                SELECT 1 FROM awa.leases ls
                WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                  AND ls.state = 'waiting_external') THEN 'waiting_external' ELSE 'running' END;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
                attempted_at, errors, progress, queue, kind)
            SELECT c.ready_slot, c.ready_generation, c.job_id, c.run_lease, c.lane_id, c.lane_seq,
                   'cancelled', c.attempt, c.claimed_at,
                   COALESCE(e.errors, '[]'::jsonb)
                   || jsonb_build_array(v_error || jsonb_build_object('attempt', c.attempt, 'at', now())),
                   COALESCE(s.progress, e.progress), e.queue, e.kind
            FROM awa.ready_entries e
            LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
            WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot;
            DELETE FROM awa.attempt_state WHERE job_id = c.job_id AND run_lease = c.run_lease;
            PERFORM pg_notify('awa_cancel',
                              json_build_object('id', c.job_id, 'lease', c.run_lease)::text);
            RETURN v_state;
        END IF;

        SELECT * INTO r FROM awa.ready_entries e
        WHERE e.job_id = p_job_id
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.ready_slot = e.ready_slot)
        ORDER BY e.run_lease DESC, e.lane_seq DESC LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- Serialise with claimers of the lane, then look again with a fresh snapshot.
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE;
        IF r.lane_seq <= awa.lane_cursor_v1(r.lane_id) THEN
            CONTINUE;  -- claimed meanwhile (or long ago): look for the open claim
        END IF;
        INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
        VALUES (r.ready_slot, r.ready_generation, r.lane_id, r.lane_seq, r.job_id)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;  -- cancelled concurrently
        END IF;
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            errors, progress, queue, kind)
        VALUES (r.ready_slot, r.ready_generation, r.job_id, r.run_lease, r.lane_id, r.lane_seq,
                'cancelled', r.attempt,
                COALESCE(r.errors, '[]'::jsonb)
                || jsonb_build_array(v_error || jsonb_build_object('attempt', r.attempt, 'at', now())),
                r.progress, r.queue, r.kind);
        PERFORM awa._lane_skip_v1(r.lane_id);
        RETURN 'available';
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION awa.queue_drain_v2(p_queue text, p_limit integer DEFAULT 1000,
                                   p_max_job_id bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_error jsonb := jsonb_build_object('type', 'Cancelled', 'message', 'queue drained');
    v_gen bigint;
    v_slot integer;
    v_lane integer;
    v_cursor bigint;
    v_n integer := 0;
    v_got integer;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.queue_drain_v2');
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit: must be at least 1' USING ERRCODE = '22023';
    END IF;
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
    WITH gone AS (
        DELETE FROM awa.deferred_jobs d
        WHERE d.job_id IN (
            SELECT d2.job_id FROM awa.deferred_jobs d2
            WHERE d2.queue = p_queue AND (p_max_job_id IS NULL OR d2.job_id <= p_max_job_id)
            ORDER BY d2.job_id LIMIT p_limit
            FOR UPDATE SKIP LOCKED)
        RETURNING d.*
    )
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at, errors,
        progress, kind, queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
    SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt, g.attempted_at,
           COALESCE(g.errors, '[]'::jsonb)
           || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
           g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at, g.created_at,
           g.metadata, g.tags
    FROM gone g;
    GET DIAGNOSTICS v_n = ROW_COUNT;

    FOR v_lane IN SELECT l.lane_id FROM awa.queue_lanes l WHERE l.queue = p_queue ORDER BY l.lane_id
    LOOP
        EXIT WHEN v_n >= p_limit;
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = v_lane FOR UPDATE;
        v_cursor := awa.lane_cursor_v1(v_lane);
        WITH picked AS MATERIALIZED (
            SELECT e.* FROM awa.ready_entries e
            WHERE e.lane_id = v_lane AND e.lane_seq > v_cursor
              AND (p_max_job_id IS NULL OR e.job_id <= p_max_job_id)
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT p_limit - v_n
        ), tomb AS (
            INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
            SELECT p.ready_slot, p.ready_generation, p.lane_id, p.lane_seq, p.job_id FROM picked p
            ON CONFLICT DO NOTHING
            RETURNING lane_id, lane_seq, ready_slot
        )
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            errors, progress, queue, kind)
        SELECT p.ready_slot, p.ready_generation, p.job_id, p.run_lease, p.lane_id, p.lane_seq,
               'cancelled', p.attempt,
               COALESCE(p.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', p.attempt, 'at', now())),
               p.progress, p.queue, p.kind
        FROM picked p
        JOIN tomb t ON t.lane_id = p.lane_id AND t.lane_seq = p.lane_seq AND t.ready_slot = p.ready_slot;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_n := v_n + v_got;
        PERFORM awa._lane_skip_v1(v_lane);
    END LOOP;
    RETURN v_n;
END
$$;
