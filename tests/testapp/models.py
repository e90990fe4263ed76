from django.db import models
from django.db.models.functions import Now


class Order(models.Model):
    """An application row, written in the same transaction as an enqueued job."""

    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"Order {self.pk}"


class Ledger(models.Model):
    """One row per handler execution, written by the test jobs: proves exactly-once per attempt."""

    job_id = models.BigIntegerField()
    run_lease = models.BigIntegerField()
    attempt = models.IntegerField()
    queue = models.CharField(max_length=63)
    note = models.CharField(max_length=50, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["job_id", "run_lease"])]

    def __str__(self) -> str:
        return f"Ledger {self.job_id}/{self.run_lease}"
