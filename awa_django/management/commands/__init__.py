"""The ``manage.py awa_*`` commands; ``_cli`` holds their shared parsers."""
