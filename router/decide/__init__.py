"""router/decide/: a decision per request and what moves it: reasons, route ids, the online estimates, feedback."""
