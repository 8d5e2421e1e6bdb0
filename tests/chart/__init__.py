"""Tests of the Helm chart, the alert rules, the dashboard and the examples."""
