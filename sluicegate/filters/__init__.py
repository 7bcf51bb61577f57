"""sluicegate.filters"""
