"""Finding a job wherever it is: the page that holds a job id now (live jobs, history or the
dead letter queue), for the "find a job" box and for a job's page that no longer has it."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from awa_django.admin.read_alias import admin_read_alias
from awa_django.admin.selection import job_id_key, valid_key
from awa_django.operator import job_show

__all__ = ["JOB_MODELS", "find_job", "job_page", "place"]

#: The admin models that show jobs, by where a job is: dead-lettered, finished, live.
JOB_MODELS = ("deadletter", "terminaljob", "livejob")
_PLACES = {"deadletter": "the DLQ", "terminaljob": "history", "livejob": "live jobs"}


def place(model: str, state: str) -> str:
    """Where a job is, for a message: "in the DLQ", "finished (failed) in history", "live
    (running)"."""
    if model == "deadletter":
        return "in the DLQ"
    if model == "terminaljob":
        return f"finished ({state}), in history"
    return f"live ({state.replace('_', ' ')})"


def job_page(text: str) -> tuple[str, str, int] | None:
    """``(model, state, job id)`` of the page that holds the job ``text`` names now, or None
    when it names no job (not an id, unknown, aged out of history, purged)."""
    key = job_id_key(text) if valid_key(text, job_id_key) else None
    job = None if key is None else job_show(key, using=admin_read_alias())
    if key is None or job is None:
        return None
    if job.in_dlq:
        return "deadletter", str(job.state), key
    if job.state in ("completed", "failed", "cancelled"):
        return "terminaljob", str(job.state), key
    return "livejob", str(job.state), key


def find_job(request: HttpRequest) -> HttpResponse:
    """``?id=N``: the page of job N wherever it is, or back where the search came from with a
    message. Finds the jobs of the pages the user may view (403 with none of them)."""
    user = request.user
    viewable = {m for m in JOB_MODELS if user.has_perm(f"awa_django.view_{m}")}
    if not viewable:
        raise PermissionDenied
    text = request.GET.get("id", "").strip()
    found = job_page(text)
    if found is None or found[0] not in viewable:
        why = "not a job id, or the job is gone (aged out of history or purged)"
        if found is not None:
            why = f"it is on a page you may not view ({_PLACES[found[0]]})"
        messages.warning(request, f"No job {text[:40]!r} to show: {why}.")
        back = request.GET.get("next", "")
        if not back.startswith("/") or back.startswith("//"):  # never off this site
            back = reverse("admin:awa_django_livejob_changelist")
        return HttpResponseRedirect(back)
    model, _, key = found
    return HttpResponseRedirect(reverse(f"admin:awa_django_{model}_change", args=[key]))
