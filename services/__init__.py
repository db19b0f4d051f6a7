"""Quire services: thin network shells around libs/."""
