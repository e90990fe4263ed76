-- Named statements of benchmarks/read_surfaces.py: `-- name: x` starts statement x.
--
-- The seed writes the engine's tables directly (set-based, generate_series), in the shape the
-- engine itself leaves them in, so that every read surface returns what it would in a real
-- deployment:
--
--   * lane-backed positions 0 .. history-1 are terminal history: one ready row (the retained
--     body) and one done row each, in the queue-ring slot of their time, in time order (so the
--     heap of every partition is in finalized_at order, as appends make it). 1 position in 500
--     is instead a "wide" done row (a scheduled job cancelled from deferred_jobs: own body, no
--     ready row), which leaves a gap in its lane, as a rolled-back producer would;
--   * the next `running` positions are claimed and open (each in the claim slot of its claim
--     time), 5 % of them parked on a callback (lease ring), 20 % with an attempt_state row;
--   * the next `available` positions are ready rows above their lane's cursor, 1 % of them
--     cancelled (tombstone and cancelled done row);
--   * `closed` claims (with closures) for the most recent history positions fill claim slots
--     0-6, and a closed marker claim sits at the top of each lane's history;
--   * deferred_jobs (75 % scheduled, 25 % retryable) and dlq_entries have their own ids.
--
-- Lanes: position p = i % 10000 maps to (queue, priority, shard), interleaved: default/0 45 %,
-- default/10 5 %, emails 25 %, reports 15 %, webhooks 9.99 %, rare 0.01 %. Kinds: ten kinds from 30 % down
-- to 1 %, and app.rare.kind for 1 position in 50,000. Outcomes: 93 % completed, 3 % failed, 4 %
-- cancelled.

-- name: drop_seed_helpers
DROP TABLE IF EXISTS seed_map;
DROP TABLE IF EXISTS seed_params

-- name: seed_params
CREATE UNLOGGED TABLE seed_params AS
SELECT %(history)s::bigint AS history, %(running)s::bigint AS running,
       %(available)s::bigint AS available, %(closed)s::bigint AS closed,
       %(deferred)s::bigint AS deferred, %(dlq)s::bigint AS dlq, %(scale)s::float8 AS scale,
       now() - interval '24 hours' - interval '1 minute' AS t0, now() AS seeded_at

-- name: seed_lanes
SELECT awa.ensure_lanes_v1(v.queue, v.priority)
FROM (VALUES ('default', 0), ('default', 10), ('emails', 0), ('reports', 0), ('webhooks', 0),
             ('rare', 0)) AS v(queue, priority)

-- name: seed_meta
UPDATE awa.queue_meta SET paused = (queue = 'rare'), dlq_enabled = (queue <> 'webhooks')

-- name: seed_map
-- Position p (0..9999) -> its lane, and for that lane: k positions per period, rank r. Groups
-- take positions by (p * 7919) %% 10000 (a permutation), so consecutive positions spread over
-- every queue.
CREATE UNLOGGED TABLE seed_map AS
WITH groups (queue, priority, lo, hi) AS (
    VALUES ('default', 0, 0, 4500), ('default', 10, 4500, 5000), ('emails', 0, 5000, 7500),
           ('reports', 0, 7500, 9000), ('webhooks', 0, 9000, 9999), ('rare', 0, 9999, 10000)
), pos AS (
    SELECT g.queue, g.priority, p,
           (row_number() OVER (PARTITION BY g.queue, g.priority ORDER BY p) - 1) %% 4 AS shard
    FROM groups g, generate_series(0, 9999) AS p
    WHERE (p * 7919) %% 10000 >= g.lo AND (p * 7919) %% 10000 < g.hi
)
SELECT pos.p, l.lane_id, pos.queue, pos.priority::smallint AS priority,
       count(*) OVER (PARTITION BY l.lane_id) AS k,
       row_number() OVER (PARTITION BY l.lane_id ORDER BY pos.p) - 1 AS r
FROM pos
JOIN awa.queue_lanes l ON l.queue = pos.queue AND l.priority = pos.priority AND l.shard = pos.shard;
CREATE UNIQUE INDEX ON seed_map (p);
ANALYZE seed_map

-- name: seed_functions
-- Deterministic helpers of the seed (dropped at the end).
CREATE FUNCTION pg_temp.seed_kind(i bigint) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN i %% 50000 = 12345 THEN 'app.rare.kind'
        WHEN (i * 7919 + 13) %% 1000 < 300 THEN 'app.emails.send_welcome'
        WHEN (i * 7919 + 13) %% 1000 < 500 THEN 'app.emails.send_digest'
        WHEN (i * 7919 + 13) %% 1000 < 650 THEN 'app.billing.charge_card'
        WHEN (i * 7919 + 13) %% 1000 < 750 THEN 'app.reports.build_daily'
        WHEN (i * 7919 + 13) %% 1000 < 830 THEN 'app.webhooks.deliver'
        WHEN (i * 7919 + 13) %% 1000 < 890 THEN 'app.search.reindex_document'
        WHEN (i * 7919 + 13) %% 1000 < 940 THEN 'app.media.resize_image'
        WHEN (i * 7919 + 13) %% 1000 < 970 THEN 'app.sync.pull_crm'
        WHEN (i * 7919 + 13) %% 1000 < 990 THEN 'app.audit.archive_events'
        ELSE 'app.cleanup.purge_sessions' END
$$;
CREATE FUNCTION pg_temp.seed_state(i bigint) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN i %% 100 < 3 THEN 'failed' WHEN i %% 100 < 7 THEN 'cancelled'
                ELSE 'completed' END
$$

-- name: seed_history_ready
-- Ready rows (retained bodies) of history positions [%(lo)s, %(hi)s).
INSERT INTO awa.ready_entries (
    ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt, max_attempts,
    run_lease, queue, kind, args, run_at, created_at, deadline_secs, metadata, tags)
SELECT s, s, m.lane_id, (i / 10000) * m.k + m.r + 1, i + 1, m.priority, 0, 25, 0, m.queue,
       pg_temp.seed_kind(i),
       jsonb_build_object('args', jsonb_build_array(i), 'kwargs',
                          jsonb_build_object('to', 'user' || (i %% 100000) || '@example.com')),
       ts - interval '2 seconds', ts - interval '2 seconds', NULL,
       CASE WHEN i %% 10 = 0 THEN jsonb_build_object('tenant', i %% 97) END,
       CASE WHEN i %% 20 = 0 THEN ARRAY['seed'] END
FROM seed_params sp,
     generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i,
     LATERAL (SELECT ((i * %(qslots)s) / sp.history)::integer AS s,
                     sp.t0 + make_interval(secs => i * 86400.0 / sp.history) AS ts) x,
     seed_map m
WHERE m.p = i %% 10000 AND i %% 500 <> 250

-- name: seed_history_counts
-- The counts of history positions [%(lo)s, %(hi)s): 32 deltas per slot, queue and outcome, as
-- finalize batches write them, left unfolded (10,000,000 jobs: 320 a key, more than the
-- leader's folds leave), so that the reads pay for every one.
INSERT INTO awa.done_counts (ready_slot, queue, state, n)
SELECT d.ready_slot, d.queue, d.state, count(*) FROM awa.done_entries d
WHERE d.job_id > %(lo)s AND d.job_id <= %(hi)s
GROUP BY d.ready_slot, d.queue, d.state, d.job_id %% 32

-- name: seed_history_done
-- Done rows of history positions [%(lo)s, %(hi)s): ready-backed, or wide (1 in 500).
INSERT INTO awa.done_entries (
    ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
    attempted_at, finalized_at, result, errors, progress, queue, kind, priority, args,
    max_attempts, run_at, created_at, metadata, tags)
SELECT s, s, i + 1,
       CASE WHEN wide THEN 0 ELSE 1 END,
       CASE WHEN wide THEN NULL ELSE m.lane_id END,
       CASE WHEN wide THEN NULL ELSE (i / 10000) * m.k + m.r + 1 END,
       CASE WHEN wide THEN 'cancelled' ELSE pg_temp.seed_state(i) END,
       CASE WHEN wide THEN 0 ELSE 1 END,
       CASE WHEN wide THEN NULL ELSE ts - interval '1 second' END,
       ts,
       CASE WHEN NOT wide AND pg_temp.seed_state(i) = 'completed'
            THEN jsonb_build_object('sent', true, 'n', i) END,
       CASE WHEN wide OR pg_temp.seed_state(i) <> 'completed'
            THEN jsonb_build_array(jsonb_build_object(
                'type', 'RuntimeError', 'message', 'boom ' || i, 'attempt', 1, 'at', ts)) END,
       NULL, m.queue,
       CASE WHEN wide OR %(done_kinds)s THEN pg_temp.seed_kind(i) END,
       CASE WHEN wide THEN m.priority END,
       CASE WHEN wide THEN jsonb_build_object('args', jsonb_build_array(i), 'kwargs', '{}'::jsonb) END,
       CASE WHEN wide THEN 25::smallint END,
       CASE WHEN wide THEN ts + interval '1 hour' END,
       CASE WHEN wide THEN ts - interval '1 hour' END,
       NULL, NULL
FROM seed_params sp,
     generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i,
     LATERAL (SELECT ((i * %(qslots)s) / sp.history)::integer AS s,
                     sp.t0 + make_interval(secs => i * 86400.0 / sp.history) AS ts,
                     i %% 500 = 250 AS wide) x,
     seed_map m
WHERE m.p = i %% 10000

-- name: seed_closed_claims
-- Claims and closures of the most recent `closed` history positions, in claim slots 0-6.
WITH pos AS MATERIALIZED (
    SELECT i, ((i - (sp.history - sp.closed)) * 7 / sp.closed)::integer AS cslot,
           ((i * %(qslots)s) / sp.history)::integer AS s,
           sp.t0 + make_interval(secs => i * 86400.0 / sp.history) AS ts,
           m.lane_id, (i / 10000) * m.k + m.r + 1 AS lane_seq
    FROM seed_params sp,
         generate_series(sp.history - sp.closed, sp.history - 1) AS i,
         seed_map m
    WHERE m.p = i %% 10000 AND i %% 500 <> 250
), c AS (
    INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease, ready_slot,
                            ready_generation, lane_id, lane_seq, attempt, claimed_at,
                            deadline_at, worker_id)
    SELECT cslot, cslot, i + 1, 1, s, s, lane_id, lane_seq, 1, ts - interval '1 second', NULL,
           ('00000000-0000-0000-0000-00000000000' || (i %% 4))::uuid
    FROM pos
)
INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome, closed_at)
SELECT cslot, i + 1, 1,
       CASE pg_temp.seed_state(i) WHEN 'completed' THEN 'completed' WHEN 'failed' THEN 'fail'
                                  ELSE 'cancel' END,
       ts
FROM pos

-- name: seed_markers
-- A closed marker claim at the top of each lane's history (as a claim-slot prune leaves).
WITH tops AS (
    SELECT m.lane_id, max((i / 10000) * m.k + m.r + 1) AS top
    FROM seed_params sp, seed_map m,
         LATERAL (SELECT sp.history - 1 - ((sp.history - 1 - m.p) %% 10000) AS i) x
    WHERE x.i >= 0
    GROUP BY m.lane_id
), c AS (
    INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease, ready_slot,
                            ready_generation, lane_id, lane_seq, attempt)
    SELECT 7, 7, -t.lane_id, t.top, -1, -1, t.lane_id, t.top, 0 FROM tops t
)
INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
SELECT 7, -t.lane_id, t.top, 'marker' FROM tops t

-- name: seed_live_ready
-- Ready rows of the running and available positions, in the current queue slot (the last).
INSERT INTO awa.ready_entries (
    ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt, max_attempts,
    run_lease, queue, kind, args, run_at, created_at, deadline_secs, metadata, tags)
SELECT %(qcur)s, %(qcur)s, m.lane_id, (i / 10000) * m.k + m.r + 1, i + 1, m.priority, 0, 25, 0, m.queue,
       pg_temp.seed_kind(i),
       jsonb_build_object('args', jsonb_build_array(i), 'kwargs',
                          jsonb_build_object('to', 'user' || (i %% 100000) || '@example.com')),
       at, at, CASE WHEN i %% 3 = 0 THEN 600 END,
       CASE WHEN i %% 10 = 0 THEN jsonb_build_object('tenant', i %% 97) END,
       CASE WHEN i %% 20 = 0 THEN ARRAY['seed'] END
FROM seed_params sp,
     generate_series(sp.history, sp.history + sp.running + sp.available - 1) AS i,
     LATERAL (SELECT sp.seeded_at - make_interval(secs =>
                  CASE WHEN i < sp.history + sp.running THEN 30 + (i %% 300)
                       ELSE 600.0 * (sp.history + sp.running + sp.available - i)
                            / sp.available END) AS at) x,
     seed_map m
WHERE m.p = i %% 10000

-- name: seed_running
-- Open claims of the running positions, claimed 1-120 s ago, each in the claim slot of its time
-- (the ring rotates every 10 s; claims older than 70 s were carried forward into slot 7); one in
-- 20 parked on a callback, one in 5 with an attempt_state row.
WITH pos AS MATERIALIZED (
    SELECT i, m.lane_id, (i / 10000) * m.k + m.r + 1 AS lane_seq,
           sp.seeded_at - make_interval(secs => 1 + (i %% 120)) AS claimed_at,
           CASE WHEN 1 + i %% 120 < 80 THEN 7 - (1 + i %% 120) / 10 ELSE 7 END AS cslot
    FROM seed_params sp,
         generate_series(sp.history, sp.history + sp.running - 1) AS i,
         seed_map m
    WHERE m.p = i %% 10000
), c AS (
    INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease, ready_slot,
                            ready_generation, lane_id, lane_seq, attempt, claimed_at,
                            deadline_at, worker_id)
    SELECT cslot, cslot, i + 1, 1, %(qcur)s, %(qcur)s, lane_id, lane_seq, 1, claimed_at,
           CASE WHEN i %% 3 = 0 THEN claimed_at + interval '10 minutes' END,
           ('00000000-0000-0000-0000-00000000000' || (i %% 4))::uuid
    FROM pos
), l AS (
    INSERT INTO awa.leases (lease_slot, lease_generation, job_id, run_lease, claim_slot, state,
                            callback_id, callback_timeout_at)
    SELECT 0, 0, i + 1, 1, cslot, 'waiting_external', gen_random_uuid(), now() + interval '1 hour'
    FROM pos WHERE i %% 20 = 7
)
INSERT INTO awa.attempt_state (job_id, run_lease, heartbeat_at, progress)
SELECT i + 1, 1, now() - interval '5 seconds', jsonb_build_object('done', i %% 100)
FROM pos WHERE i %% 5 = 1

-- name: seed_cancelled_available
-- One in 100 of the available positions were cancelled: a tombstone and a cancelled done row.
WITH pos AS MATERIALIZED (
    SELECT i, m.lane_id, (i / 10000) * m.k + m.r + 1 AS lane_seq, m.queue
    FROM seed_params sp,
         generate_series(sp.history + sp.running, sp.history + sp.running + sp.available - 1) AS i,
         seed_map m
    WHERE m.p = i %% 10000 AND i %% 100 = 42
), t AS (
    INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
    SELECT %(qcur)s, %(qcur)s, lane_id, lane_seq, i + 1 FROM pos
), c AS (
    INSERT INTO awa.done_counts (ready_slot, queue, state, n)
    SELECT %(qcur)s, queue, 'cancelled', count(*) FROM pos GROUP BY queue
)
INSERT INTO awa.done_entries (ready_slot, ready_generation, job_id, run_lease, lane_id,
                              lane_seq, state, attempt, errors, queue, kind)
SELECT %(qcur)s, %(qcur)s, i + 1, 0, lane_id, lane_seq, 'cancelled', 0,
       '[{"type": "Cancelled", "message": "cancelled in admin", "attempt": 0}]', queue,
       CASE WHEN %(done_kinds)s THEN pg_temp.seed_kind(i) END
FROM pos

-- name: seed_deferred
INSERT INTO awa.deferred_jobs (job_id, state, queue, priority, kind, args, attempt, max_attempts,
                               run_lease, run_at, created_at, attempted_at, errors)
SELECT id, CASE WHEN j %% 4 = 3 THEN 'retryable' ELSE 'scheduled' END,
       (ARRAY['default', 'emails', 'reports', 'webhooks'])[1 + j %% 4], 0,
       pg_temp.seed_kind(j), jsonb_build_object('args', jsonb_build_array(j), 'kwargs', '{}'::jsonb),
       CASE WHEN j %% 4 = 3 THEN 1 + j %% 3 ELSE 0 END, 25,
       CASE WHEN j %% 4 = 3 THEN 1 + j %% 3 ELSE 0 END,
       now() + make_interval(secs => 60 + j %% 86400), now() - interval '1 hour',
       CASE WHEN j %% 4 = 3 THEN now() - interval '1 minute' END,
       CASE WHEN j %% 4 = 3 THEN '[{"type": "RuntimeError", "message": "retry me"}]'::jsonb END
FROM seed_params sp,
     generate_series(0, sp.deferred - 1) AS j,
     LATERAL (SELECT sp.history + sp.running + sp.available + j + 1 AS id) x

-- name: seed_dlq
INSERT INTO awa.dlq_entries (job_id, queue, priority, kind, args, attempt, max_attempts,
                             run_lease, original_run_lease, run_at, created_at, attempted_at,
                             errors, dlq_reason, dlq_at)
SELECT id, (ARRAY['default', 'emails', 'reports'])[1 + j %% 3], 0, pg_temp.seed_kind(j),
       jsonb_build_object('args', jsonb_build_array(j), 'kwargs', '{}'::jsonb), 25, 25, 25, 25,
       at - interval '1 day', at - interval '1 day', at,
       jsonb_build_array(jsonb_build_object('type', 'RuntimeError', 'message', 'gave up',
                                            'attempt', 25, 'traceback', repeat('frame\n', 20))),
       'max_attempts exhausted: gave up', at
FROM seed_params sp,
     generate_series(0, sp.dlq - 1) AS j,
     LATERAL (SELECT sp.history + sp.running + sp.available + sp.deferred + j + 1 AS id,
                     now() - make_interval(secs => (j * 2592000.0) / sp.dlq) AS at) x

-- name: seed_rings
DELETE FROM awa.ring_rotations;
INSERT INTO awa.ring_rotations (ring, generation, slot, rotated_at)
SELECT 'queue', g, g, sp.t0 + make_interval(secs => g * 86400.0 / %(qslots)s)
FROM seed_params sp, generate_series(0, %(qcur)s) g
UNION ALL
SELECT 'claim', g, g, now() - make_interval(secs => (7 - g) * 10) FROM generate_series(0, 7) g
UNION ALL
SELECT 'lease', 0, 0, now() - interval '1 hour'

-- name: seed_runtimes
INSERT INTO awa.runtime_instances (instance_id, hostname, pid, queues, concurrency, version,
                                   is_leader)
SELECT ('00000000-0000-0000-0000-00000000000' || w)::uuid, 'host-' || (w / 2), 1000 + w,
       '{"default": 512, "emails": 128, "reports": 32, "webhooks": 64}', 736, 'bench', w = 0
FROM generate_series(0, 3) w

-- name: seed_sequences
SELECT setval('awa.job_id_seq', sp.history + sp.running + sp.available + sp.deferred + sp.dlq)
FROM seed_params sp;
SELECT setval(l.enqueue_seq, COALESCE(t.top, 1), t.top IS NOT NULL)
FROM awa.queue_lanes l
CROSS JOIN LATERAL (SELECT max(e.lane_seq) AS top FROM awa.ready_entries e
                    WHERE e.lane_id = l.lane_id) t

-- name: autovacuum_off
DO $$
DECLARE t regclass;
BEGIN
    FOR t IN SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'awa' AND c.relkind = 'r'
    LOOP
        EXECUTE format('ALTER TABLE %%s SET (autovacuum_enabled = false)', t);
    END LOOP;
END
$$

-- name: write_cost_cleanup
-- Everything the write-path probe wrote (queue writecost, in the current queue slot of the
-- seed), gone, and its partitions vacuumed: the read surfaces see the seed as it was.
DELETE FROM awa.claim_closures z USING awa.claims c
WHERE c.lane_id IN (SELECT l.lane_id FROM awa.queue_lanes l WHERE l.queue = 'writecost')
  AND z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.claim_slot = c.claim_slot;
DELETE FROM awa.claims c
WHERE c.lane_id IN (SELECT l.lane_id FROM awa.queue_lanes l WHERE l.queue = 'writecost');
DELETE FROM awa.done_entries d
WHERE d.ready_slot = %(qcur)s
  AND d.lane_id IN (SELECT l.lane_id FROM awa.queue_lanes l WHERE l.queue = 'writecost');
DELETE FROM awa.done_counts WHERE queue = 'writecost';
DELETE FROM awa.ready_entries e
WHERE e.lane_id IN (SELECT l.lane_id FROM awa.queue_lanes l WHERE l.queue = 'writecost');
DELETE FROM awa.queue_lanes WHERE queue = 'writecost';
DELETE FROM awa.queue_meta WHERE queue = 'writecost'

-- name: write_cost_vacuum
VACUUM (ANALYZE) awa.claims, awa.claim_closures, awa.ready_entries_{qcur}, awa.done_entries_{qcur},
    awa.queue_lanes, awa.queue_meta

-- name: analyze
ANALYZE awa.ready_entries, awa.ready_tombstones, awa.done_entries, awa.claims,
        awa.claim_closures, awa.leases, awa.attempt_state, awa.deferred_jobs, awa.dlq_entries,
        awa.queue_meta, awa.queue_lanes, awa.lane_floors, awa.ring_rotations,
        awa.runtime_instances
