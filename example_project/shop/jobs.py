"""The shop's job kinds (confirmation e-mails, invoices, ...), added with the worker."""
