"""The status page served at ``/``: overview, reliability diagrams, label-free estimates."""
