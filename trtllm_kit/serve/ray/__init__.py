"""``serve --ray``: the artifact as a Ray Serve application on a private Ray, started, watched and stopped as
one service."""
