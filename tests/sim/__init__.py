"""Tests of the simulator, and the closed loop of the simulator and the decisions."""
