"""sluicegate.config"""
