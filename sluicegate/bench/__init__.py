"""sluicegate.bench"""
