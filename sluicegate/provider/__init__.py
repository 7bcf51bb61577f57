"""sluicegate.provider"""
