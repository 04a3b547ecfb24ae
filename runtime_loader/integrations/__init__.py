"""Adapters that plug a Dispatcher into serving and modelling libraries (imported on demand)."""
