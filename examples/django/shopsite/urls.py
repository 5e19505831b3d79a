from django.urls import path
from shop.views import create_order

urlpatterns = [path("orders", create_order)]
