from django.contrib import admin

from shop.models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "customer_email", "note", "created_at"]
    search_fields = ["customer_email"]
