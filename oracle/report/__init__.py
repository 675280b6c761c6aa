"""What a run leaves behind: check results and reports (table, JSON, plots) and saved failing
cases with their provenance. Imports :mod:`oracle.cases` and :mod:`oracle.judge`."""
