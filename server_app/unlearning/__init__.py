"""Unlearning: requests, the frameworks (SE, FR, FE, RR) and their driver."""
