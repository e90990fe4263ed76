-- The grants of `manage.py awa_roles` (docs/roles.md): one block per role, printed or run in
-- this order for the roles named on the command line. Each block first takes back what the
-- role may hold on the awa schema, then grants what it needs, so running the script again
-- (after a migrate, or on a database where the role had wider grants) converges.
--
-- No role but the owner holds INSERT, UPDATE, DELETE or TRUNCATE on any awa table, or any
-- privilege on a sequence beyond reading it: every change to the queue goes through a function
-- that runs as the owner (SECURITY DEFINER, search_path fixed), validates what it is given and
-- writes only what the engine writes. A role may call the functions of its lists below and
-- nothing else (awa_django/sql/functions/privileges.sql takes every awa function from PUBLIC).
--
-- The placeholders in braces are role names and the database name, validated and quoted as
-- identifiers by awa_django.db.roles (psycopg.sql.Identifier), and the function lists below,
-- whose names are checked and quoted the same way. Nothing else is substituted.
--
-- Tables and sequences that later migrations add, and the lane sequences that producers create
-- (awa.ensure_lanes_v1, run as the owner), are covered by default privileges of the owner.

-- name: producer_functions
-- Enqueue (a new queue and priority included) and resolve or extend a callback: the
-- application, and handlers in the workers.
awa.ensure_lanes_v1, awa.enqueue_one_v1, awa.enqueue_one_v2, awa.enqueue_one_v3,
awa.enqueue_v1, awa.workflow_enqueue_v1, awa.callback_resolve_v2, awa.callback_extend_v1

-- name: app_functions
-- The application's own: the signed callback receiver's statement, one job by id (get_result,
-- job_show), when a job was enqueued (the django.tasks backend), the health view's lag check,
-- a workflow's state and results (its handle's waits; a step's ctx.upstream).
awa.callback_receive_v1, awa.job_v1, awa.job_enqueued_at_v1, awa.queue_lag_v1, awa.workflow_v1,
awa.workflow_results_v1, awa.workflow_upstream_v1, awa.workflow_upstream_result_v1

-- name: read_functions
-- The read surfaces (docs/sql.md, "Reading jobs"), and the functions the views call
-- (awa.lane_cursor_v1 in awa.live_jobs, awa._queue_names_v1 in awa.queue_stats,
-- awa._live_seconds_v1 in awa.descriptor_status).
awa.job_v1, awa.job_list_v1, awa.job_enqueued_at_v1, awa.queue_counts_v1,
awa.queue_depth_v1, awa.queue_lag_v1, awa.queue_stats_v1, awa.throughput_v1,
awa.outcomes_per_minute_v1, awa.queue_minutes_v2, awa.undeclared_kinds_v1,
awa.ring_slots_v1, awa.flow_status_v1, awa.flow_kind_status_v1, awa.lane_cursor_v1,
awa._queue_names_v1, awa._live_seconds_v1, awa.workflow_v1, awa.workflows_v1,
awa.workflow_counts_v1, awa.workflow_steps_v1, awa.workflow_results_v1,
awa.workflow_upstream_v1, awa.workflow_upstream_result_v1, awa.workflow_of_v1

-- name: worker_functions
-- Claim, heartbeat, finalize (complete, retry, snooze, cancel, fail, park for a callback),
-- release and retake flow permits and serial keys, register the process, find work across
-- queues, and write what the code declares: queue and kind limits, periodic schedules, the
-- queues' DLQ setting, the queues' and kinds' descriptors; a step's dependencies' results.
awa.claim_v3, awa._attempt_open_v1, awa.finalize_v2, awa.finalize_v3, awa.heartbeat_v1,
awa.callback_register_v1, awa.flow_release_v1, awa.flow_retake_v1, awa.flow_reset_v1,
awa.serial_release_v1, awa.serial_retake_v1, awa.serial_reset_v1, awa.flow_sync_v1,
awa.flow_kind_sync_v1, awa.cron_sync_v1, awa.queue_dlq_v1, awa.runtime_upsert_v1,
awa.runtime_remove_v1, awa.queues_ready_v2, awa.queues_idle_v2, awa.descriptors_report_v1,
awa.workflow_upstream_v1, awa.workflow_upstream_result_v1

-- name: maintenance_functions
-- The leader's tasks: promotion, rescue, rotation and prune (TRUNCATE of sealed slots, as the
-- owner), retention, unique and serial sweeps, periodic fires, the leader's mark, the queue
-- charts' roll-up. Two run with the caller's privileges, because what they do is end other
-- sessions (frozen leaders and workers), which takes pg_signal_backend:
-- awa.leader_takeover_v1, awa.flow_reap_v1.
awa.promote_v1, awa.rescue_v1, awa.rotate_v3, awa.prune_v1, awa.dlq_expire_v1,
awa.cleanup_v1, awa.callback_receipts_prune_v1, awa.unique_sweep_v1, awa.serial_sweep_v1,
awa.cron_fire_v1, awa.leader_mark_v1, awa.leader_grace_v1, awa.leader_takeover_v1,
awa.flow_reap_v1, awa.queue_minutes_record_v1, awa.descriptors_prune_v1,
awa.done_counts_fold_v1, awa.workflows_prune_v1

-- name: operator_functions
-- The admin's actions and the CLI's (docs/operations.md): cancel, DLQ retry and purge, retry
-- from history, pause, resume and drain a queue, its DLQ on or off, flow limits, periodic
-- schedules paused, resumed or triggered, callbacks resolved or extended.
awa.cancel_v1, awa.dlq_retry_v2, awa.dlq_purge_v1, awa.history_retry_v1, awa.queue_pause_v1,
awa.queue_drain_v2, awa.queue_dlq_v1, awa.flow_set_v1, awa.flow_kind_set_v1,
awa.cron_pause_v1, awa.cron_trigger_v1, awa.callback_resolve_v2, awa.callback_extend_v1,
awa.workflow_cancel_v1, awa.workflow_retry_v1

-- name: advisory_functions
-- PostgreSQL's advisory-lock functions (every signature): any role may call them by default.
FUNCTION pg_catalog.pg_advisory_lock(bigint), pg_catalog.pg_advisory_lock(integer, integer),
    pg_catalog.pg_advisory_lock_shared(bigint),
    pg_catalog.pg_advisory_lock_shared(integer, integer),
    pg_catalog.pg_advisory_unlock(bigint), pg_catalog.pg_advisory_unlock(integer, integer),
    pg_catalog.pg_advisory_unlock_shared(bigint),
    pg_catalog.pg_advisory_unlock_shared(integer, integer),
    pg_catalog.pg_advisory_unlock_all(),
    pg_catalog.pg_advisory_xact_lock(bigint), pg_catalog.pg_advisory_xact_lock(integer, integer),
    pg_catalog.pg_advisory_xact_lock_shared(bigint),
    pg_catalog.pg_advisory_xact_lock_shared(integer, integer),
    pg_catalog.pg_try_advisory_lock(bigint), pg_catalog.pg_try_advisory_lock(integer, integer),
    pg_catalog.pg_try_advisory_lock_shared(bigint),
    pg_catalog.pg_try_advisory_lock_shared(integer, integer),
    pg_catalog.pg_try_advisory_xact_lock(bigint),
    pg_catalog.pg_try_advisory_xact_lock(integer, integer),
    pg_catalog.pg_try_advisory_xact_lock_shared(bigint),
    pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer)

-- name: advisory
-- (--lock-advisory; run as a superuser.) awa_django's leader election, lane locks, flow
-- permits and serial keys are advisory locks, which any role may take by default: a session of
-- the app, operator or reader role could hold one for ever (no leader, a stalled queue). In
-- this database only, the functions are taken from PUBLIC and given to the owner and the
-- maintenance role (the leader's lock is taken outside any function); every other lock is
-- taken inside the functions that run as the owner. Other software in this database that uses
-- advisory locks needs a grant too.
REVOKE EXECUTE ON {advisory_functions} FROM PUBLIC;
GRANT EXECUTE ON {advisory_functions} TO {advisory_roles};

-- name: owner
-- The migration owner runs `manage.py migrate`: it creates the awa schema and owns everything
-- in it, and the functions the other roles call run as it. It must not be a superuser
-- (docs/roles.md).
GRANT CONNECT, CREATE ON DATABASE {database} TO {owner};

-- name: app
-- The application: enqueue (a new queue and priority included), resolve callbacks, read one
-- job by id. It reads no table but two control tables without job data (the lanes, for its
-- cache of them; the processes, for the health view): no list of jobs, no arguments or results
-- but by id, no callback ids.
GRANT CONNECT ON DATABASE {database} TO {app};
REVOKE CREATE ON SCHEMA awa FROM {app};
GRANT USAGE ON SCHEMA awa TO {app};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {app};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {app};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM {app};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON TABLES FROM {app};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON SEQUENCES FROM {app};
GRANT SELECT ON awa.queue_lanes, awa.runtime_instances TO {app};
GRANT EXECUTE ON FUNCTION {producer_functions}, {app_functions} TO {app};

-- name: worker
-- Workers (`awa_worker --no-maintenance`): claim, heartbeat, finalize, park and resolve
-- callbacks, and enqueue from handlers, through the functions above, and read every awa table
-- and view (a worker claims any job of its queues: reading them gives it nothing more). No
-- maintenance function, so it never stands for leader. LISTEN needs no grant.
GRANT CONNECT ON DATABASE {database} TO {worker};
REVOKE CREATE ON SCHEMA awa FROM {worker};
GRANT USAGE ON SCHEMA awa TO {worker};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {worker};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {worker};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON TABLES FROM {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON SEQUENCES FROM {worker};
GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {worker};
GRANT SELECT ON ALL SEQUENCES IN SCHEMA awa TO {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON TABLES TO {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON SEQUENCES TO {worker};
GRANT EXECUTE ON FUNCTION {producer_functions}, {read_functions}, {worker_functions} TO {worker};

-- name: maintenance
-- The maintenance leader (`awa_maintenance`, or workers that take part in the election):
-- everything a worker may, plus the leader's tasks, through their functions. No TRUNCATE,
-- DELETE or UPDATE of its own: prune truncates as the owner, and only slots it proved spent.
GRANT CONNECT ON DATABASE {database} TO {maintenance};
REVOKE CREATE ON SCHEMA awa FROM {maintenance};
GRANT USAGE ON SCHEMA awa TO {maintenance};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {maintenance};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {maintenance};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM {maintenance};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON TABLES FROM {maintenance};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa
    REVOKE ALL ON SEQUENCES FROM {maintenance};
GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {maintenance};
GRANT SELECT ON ALL SEQUENCES IN SCHEMA awa TO {maintenance};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON TABLES TO {maintenance};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa
    GRANT SELECT ON SEQUENCES TO {maintenance};
GRANT EXECUTE ON FUNCTION {producer_functions}, {read_functions}, {worker_functions},
    {maintenance_functions} TO {maintenance};

-- name: operator
-- An operator (the admin with its actions, awa_queue, awa_dlq, awa_job, awa_status, SQL
-- users): read every awa table, view and sequence, and act through the operator functions.
-- It cannot enqueue jobs of its choice, claim, finalize or run maintenance.
GRANT CONNECT ON DATABASE {database} TO {operator};
REVOKE CREATE ON SCHEMA awa FROM {operator};
GRANT USAGE ON SCHEMA awa TO {operator};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {operator};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {operator};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM {operator};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON TABLES FROM {operator};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON SEQUENCES FROM {operator};
GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {operator};
GRANT SELECT ON ALL SEQUENCES IN SCHEMA awa TO {operator};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON TABLES TO {operator};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON SEQUENCES TO {operator};
GRANT EXECUTE ON FUNCTION {read_functions}, {operator_functions} TO {operator};

-- name: reader
-- Read-only (a read-only admin, dashboards, awa_status, awa_job show and list, SQL users):
-- read every awa table, view and sequence, and the read functions. No action of any kind.
GRANT CONNECT ON DATABASE {database} TO {reader};
REVOKE CREATE ON SCHEMA awa FROM {reader};
GRANT USAGE ON SCHEMA awa TO {reader};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {reader};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {reader};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM {reader};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON TABLES FROM {reader};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa REVOKE ALL ON SEQUENCES FROM {reader};
GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {reader};
GRANT SELECT ON ALL SEQUENCES IN SCHEMA awa TO {reader};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON TABLES TO {reader};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON SEQUENCES TO {reader};
GRANT EXECUTE ON FUNCTION {read_functions} TO {reader};
