-- Named queries of the cross-system benchmark (benchmarks/peers). `-- name: x` starts query x.
-- The per-system `*_window` queries return (finished, first_start, last_finish) from the
-- system's own tables: how many jobs finished successfully, when the first one started and
-- when the last one finished, both on the database clock. `*_count` counts the jobs it holds.

-- name: ledger_schema
CREATE EXTENSION IF NOT EXISTS pgstattuple;
CREATE UNLOGGED TABLE IF NOT EXISTS bench_produced (
    key bigint PRIMARY KEY,
    committed_at timestamptz NOT NULL
);
CREATE UNLOGGED TABLE IF NOT EXISTS bench_done (
    key bigint NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
);

-- name: produced
INSERT INTO bench_produced (key, committed_at) VALUES (%s, clock_timestamp())

-- name: done
INSERT INTO bench_done (key, started_at, finished_at)
VALUES (%s, clock_timestamp() - make_interval(secs => %s), clock_timestamp())

-- name: done_count
SELECT count(DISTINCT key) FROM bench_done WHERE key >= %s

-- name: latency
-- Milliseconds from the enqueue commit to the handler's start (pickup) and end (e2e), for the
-- keys from the one given; a job run twice counts with its first run.
WITH first_run AS (
    SELECT key, min(started_at) AS started_at, min(finished_at) AS finished_at
    FROM bench_done WHERE key >= %s GROUP BY key
), lat AS (
    SELECT extract(epoch FROM f.started_at - p.committed_at) * 1000 AS pickup,
           extract(epoch FROM f.finished_at - p.committed_at) * 1000 AS e2e
    FROM first_run f JOIN bench_produced p USING (key)
)
SELECT count(*),
       percentile_cont(0.50) WITHIN GROUP (ORDER BY pickup),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY pickup),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY pickup),
       percentile_cont(0.50) WITHIN GROUP (ORDER BY e2e),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY e2e),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY e2e),
       max(e2e)
FROM lat

-- name: completed_in_span
-- The producer's window (first to last commit, seconds) and the jobs finished within it.
SELECT extract(epoch FROM max(p.committed_at) - min(p.committed_at)),
       (SELECT count(*) FROM bench_done d
        WHERE d.key >= %s AND d.finished_at <= max(p.committed_at))
FROM bench_produced p WHERE p.key >= %s

-- name: system_tables
-- Every table a system wrote in its own database: everything but the benchmark's ledger,
-- Django's framework tables and the catalogs.
SELECT c.oid::regclass::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm') AND c.relpersistence <> 't'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  AND c.relname NOT IN ('bench_produced', 'bench_done', 'django_migrations',
                        'django_content_type', 'django_session', 'django_admin_log')
  AND c.relname NOT LIKE 'auth\_%%'
ORDER BY 1

-- name: table_stats
-- Exact figures (pgstattuple scans the table) plus the size with indexes and TOAST.
SELECT t.dead_tuple_count, t.tuple_count, pg_total_relation_size(%s::regclass)
FROM pgstattuple(%s::regclass) t

-- name: pin
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT txid_current();
SELECT count(*) FROM bench_produced;

-- name: awa_django_window
SELECT count(*), min(c.claimed_at), max(d.finalized_at)
FROM awa.done_entries d
JOIN awa.claims c ON c.job_id = d.job_id AND c.run_lease = d.run_lease
WHERE d.state = 'completed'

-- name: awa_django_finished
-- Polled during a drain: the window's join of every completion with its claim cost 60-80 ms
-- at 20,000 jobs, a third of a CPU of the two the workers run on, every 0.2 s.
SELECT count(*) FROM awa.done_entries WHERE state = 'completed'

-- name: awa_django_count
SELECT count(*) FROM awa.jobs

-- name: procrastinate_window
SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
       (SELECT min(at) FROM procrastinate_events WHERE type = 'started'),
       (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded')

-- name: procrastinate_count
SELECT count(*) FROM procrastinate_jobs

-- name: pgqueuer_window
SELECT count(*) FILTER (WHERE status = 'successful'),
       min(created) FILTER (WHERE status = 'picked'),
       max(created) FILTER (WHERE status = 'successful')
FROM pgqueuer_log

-- name: pgqueuer_count
SELECT (SELECT count(*) FROM pgqueuer)
     + (SELECT count(*) FROM pgqueuer_log WHERE status NOT IN ('queued', 'picked'))

-- name: django_tasks_db_window
SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), min(started_at), max(finished_at)
FROM django_tasks_database_dbtaskresult

-- name: django_tasks_db_count
SELECT count(*) FROM django_tasks_database_dbtaskresult

-- name: chancy_window
SELECT count(*) FILTER (WHERE state = 'succeeded'), min(started_at), max(completed_at)
FROM chancy_jobs

-- name: chancy_count
SELECT count(*) FROM chancy_jobs
