-- The fleet test's ledger, in schema `fleet` of its database. Named statements (`-- name: x`)
-- are loaded by tests/fleet/sql.py; values are always parameters.

-- name: schema
CREATE SCHEMA fleet;
-- Jobs whose enqueue committed (written in the producer's transaction).
CREATE TABLE fleet.committed (
    job_id bigint PRIMARY KEY,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One row per handler execution, written by the handler on its host's Django connection.
CREATE TABLE fleet.exec (
    exec_key uuid PRIMARY KEY,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    attempt integer NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);
CREATE INDEX exec_job_idx ON fleet.exec (job_id);

-- name: committed_insert
INSERT INTO fleet.committed (job_id) VALUES (%s)

-- name: exec_start
INSERT INTO fleet.exec (exec_key, job_id, run_lease, attempt, host, pid)
VALUES (%s, %s, %s, %s, %s, %s)

-- name: exec_finish
UPDATE fleet.exec SET finished_at = clock_timestamp() WHERE exec_key = %s

-- name: now
SELECT clock_timestamp()

-- name: hba_file
SELECT current_setting('hba_file')

-- name: reload
SELECT pg_reload_conf()

-- name: worker_hosts
-- Worker connections per client address (a host's veth address).
SELECT host(client_addr), count(*) FROM pg_stat_activity
WHERE client_addr IS NOT NULL AND host(client_addr) <> '127.0.0.1'
GROUP BY 1

-- name: runtimes
SELECT count(*) FROM awa.runtime_instances WHERE last_seen_at > now() - interval '2 seconds'

-- name: leader_addr
-- The address of the connection that holds the maintenance lock ("AWA_MAIN").
SELECT host(a.client_addr)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted
  AND l.classid = 1096237407 AND l.objid = 1296124238 AND l.objsubid = 1

-- name: running_on
-- Executions on a host that have started and not finished.
SELECT job_id, run_lease, attempt FROM fleet.exec WHERE host = %s AND finished_at IS NULL

-- name: rescues
-- Every "heartbeat stale" rescue recorded in a job's errors: job, attempt, when.
SELECT j.id, (e ->> 'attempt')::integer, (e ->> 'at')::timestamptz
FROM awa.jobs j, jsonb_array_elements(j.errors) e
WHERE j.kind = 'fleet.work' AND e ->> 'type' = 'awa_django.Rescued'
  AND starts_with(e ->> 'message', 'heartbeat stale')

-- name: executions
SELECT job_id, run_lease, attempt, host, started_at, finished_at FROM fleet.exec

-- name: jobs
SELECT id, state, run_lease FROM awa.jobs WHERE kind = 'fleet.work'

-- name: committed
SELECT job_id FROM fleet.committed

-- name: unfinished
SELECT count(*) FROM fleet.committed c
WHERE NOT EXISTS (
    SELECT 1 FROM awa.jobs j WHERE j.id = c.job_id AND j.state IN ('completed', 'failed', 'cancelled')
)
