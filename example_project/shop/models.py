from django.db import models
from django.db.models.functions import Now


class Order(models.Model):
    """A customer's order; placing one enqueues its follow-up jobs atomically."""

    customer_email = models.EmailField()
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Order {self.pk} for {self.customer_email}"
