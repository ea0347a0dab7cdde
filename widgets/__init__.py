"""Views on a session: one module per dashboard panel, composed by widgets.dashboard.Dashboard."""
