"""sluicegate.envoy"""
